"""The local Connect worker's files under ``<runtime>/connect`` (see ``worker.py``'s docstring),
its state and the connectors recorded in ``connectors.json``: what ``worker.py`` (the process)
and ``connectors.py`` (the connectors) both read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_service import read_json, runs_with, say, write_json  # platform/services/
from server import write_private  # platform/postgres/server.py
from slots import PgAccess

from pipelines.errors import ConfigError
from pipelines.settings import Settings

MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"


class WorkerError(RuntimeError):
    """The worker failed to start or died, or a connector failed."""


@dataclass(frozen=True)
class WorkerPaths:
    """The worker's files under ``<runtime>/connect`` and the jars it runs on."""

    root: Path
    jars: Path
    plugins: Path

    @classmethod
    def of(cls, settings: Settings) -> WorkerPaths:
        return cls(
            settings.runtime_dir / "connect",
            settings.jars_dir / "connect",
            settings.jars_dir / "connect-plugins",
        )

    @property
    def properties(self) -> Path:
        return self.root / "worker.properties"

    @property
    def offsets(self) -> Path:
        return self.root / "offsets.dat"

    @property
    def registry(self) -> Path:
        return self.root / "connectors.json"

    @property
    def secrets(self) -> Path:
        return self.root / "postgres.properties"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def log_file(self) -> Path:
        return self.logs / "connect.out"

    @property
    def state(self) -> Path:
        return self.root / "worker.json"

    @property
    def lock(self) -> Path:
        return self.root / ".worker.lock"


def read_registry(paths: WorkerPaths) -> dict[str, dict[str, Any]]:
    """The connectors created here (``connectors.json``), by name."""
    return dict(read_json(paths.registry) or {})


def write_registry(paths: WorkerPaths, registry: dict[str, dict[str, Any]]) -> None:
    write_json(paths.registry, registry)


def write_secrets(paths: WorkerPaths, pg: PgAccess) -> str:
    """Write the password for the connectors (mode 600); return the reference they hold."""
    paths.root.mkdir(parents=True, exist_ok=True)
    write_private(paths.secrets, f"password={pg.password}\n")
    return f"${{file:{paths.secrets}:password}}"


def live_state(paths: WorkerPaths) -> dict[str, Any] | None:
    """The state of the running worker; a stale ``worker.json`` is removed."""
    state = read_json(paths.state)
    if state is None:
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and runs_with(pid, MAIN_CLASS, str(paths.properties)):
        return state
    say(f"removing stale {paths.state} (process {pid} is gone)")
    paths.state.unlink(missing_ok=True)
    return None


def require_worker(paths: WorkerPaths) -> dict[str, Any]:
    state = live_state(paths)
    if state is None:
        raise ConfigError(f"no Connect worker is running for {paths.root}: `make connect-start`")
    return state

"""The benchmark's own S3 store (s3proxy), started and stopped through ``platform/s3/store.py``.

Like the benchmark's broker (``bench/own_broker.py``): the store's runtime folder is inside the
benchmark's temporary folder, so its objects, its credentials and its port are its own, and it
listens on 127.0.0.1 only. :func:`own_store` stops it on the way out, also on errors.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import PROJECT_ROOT, PYTHON, BenchError, conflux_env, say
from pipelines.storage import S3Connection

STORE_SCRIPT = PROJECT_ROOT / "platform" / "s3" / "store.py"


@dataclass(frozen=True)
class OwnStore:
    runtime_dir: Path
    state: dict[str, Any]
    connection: S3Connection
    command_seconds: float

    @property
    def bucket(self) -> str:
        return str(self.state["bucket"])

    @property
    def port(self) -> int:
        return int(self.state["port"])

    def settings(self, prefix: str) -> dict[str, str]:
        """Settings fields that put a flow's lake and checkpoints under ``prefix`` of the
        bucket (what ``CONFLUX_LAKE_ROOT`` and friends would say). They hold the secret: hand
        them to a child's environment only, never to its command line or a report."""
        root = f"s3a://{self.bucket}/{prefix}"
        return {
            "lake_root": f"{root}/lake",
            "checkpoints_root": f"{root}/checkpoints",
            "s3_endpoint": str(self.connection.endpoint),
            "s3_region": self.connection.region,
            "s3_access_key_id": self.connection.access_key_id,
            "s3_secret_access_key": self.connection.secret_access_key,
        }


def store_cli(
    runtime_dir: Path, jars_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    return service_cli(STORE_SCRIPT, runtime_dir, jars_dir, *args, timeout=timeout)


def service_cli(
    script: Path, runtime_dir: Path, jars_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """A ``platform/`` manager's command, its runtime folder ``runtime_dir``, output captured."""
    return subprocess.run(
        [PYTHON, str(script), *args],
        env=conflux_env(runtime_dir, jars_dir),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_store(runtime_dir: Path, jars_dir: Path) -> OwnStore:
    """Start a store with a fresh data folder in ``runtime_dir``; time the start command."""
    say(f"starting an S3 store (s3proxy) in {runtime_dir}")
    started = time.monotonic()
    result = store_cli(runtime_dir, jars_dir, "start", "--timeout", "120", timeout=240)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise BenchError(f"S3 store start failed (exit {result.returncode}):\n{result.stderr}")
    state = json.loads(result.stdout)
    if state.get("already_running"):
        raise BenchError(f"an S3 store already ran in {runtime_dir}: not the benchmark's own")
    saved = json.loads(Path(state["credentials_file"]).read_text())
    connection = S3Connection(
        state["endpoint"], saved["access_key_id"], saved["secret_access_key"], state["region"]
    )
    say(f"S3 store ready at {state['endpoint']} ({state['ready_seconds']} s)")
    return OwnStore(runtime_dir, state, connection, seconds)


def stop_store(runtime_dir: Path, jars_dir: Path) -> None:
    """Stop the store of ``runtime_dir`` (a no-op if none runs); never raises."""
    try:
        result = store_cli(runtime_dir, jars_dir, "stop", "--timeout", "30", timeout=90)
    except (OSError, subprocess.TimeoutExpired) as exc:
        say(f"WARNING: stopping the S3 store failed: {exc}")
        return
    say(f"S3 store stop: exit {result.returncode}: {result.stderr.strip()}")


@contextlib.contextmanager
def own_store(runtime_dir: Path, jars_dir: Path) -> Iterator[OwnStore]:
    """A running store for the ``with`` block, stopped at its end (also on errors)."""
    try:
        yield start_store(runtime_dir, jars_dir)
    finally:
        stop_store(runtime_dir, jars_dir)

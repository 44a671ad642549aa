"""Local S3-compatible object store for Conflux: s3proxy (Apache-2.0) on its filesystem backend.

Run it as a script (from any directory)::

    .venv/bin/python platform/s3/store.py start [--port N] [--timeout 60]
    .venv/bin/python platform/s3/store.py stop [--timeout 30]
    .venv/bin/python platform/s3/store.py status
    .venv/bin/python platform/s3/store.py env      # CONFLUX_S3_* lines for a shell (has the secret)

Everything lives under ``<runtime>/s3``: the objects in ``data/`` (a bucket is a folder),
``s3proxy.properties``, ``credentials.json`` (mode 600: an access key, a secret and the port,
made once per installation, so clients keep working across restarts), the log in
``logs/store.out`` and ``store.json``, the state of the running server (no secret in it). The
bucket :data:`BUCKET` is created at start.

Why s3proxy's filesystem backend: it implements ``If-None-Match: *`` PUTs atomically (the object
appears by ``link(2)``, which fails when the key exists), the conditional create one writer per
flow rests on. Its ``If-Match`` is read-then-write, not atomic: Conflux never relies on it.

Machine-readable results (JSON) go to stdout, messages to stderr. Exit codes: 0 success,
1 store failure or not healthy, 2 configuration problem (missing Java or jar, port taken...).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from local_service import (  # platform/services/local_service.py
    HOST,
    Command,
    ensure_port_free,
    free_ports,
    locked,
    log_tail,
    now,
    pid_alive,
    print_json,
    read_json,
    run_cli,
    runs_with,
    say,
    spawn_logged,
    terminate,
    write_json,
)

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, java_executable, require_jars
from pipelines.profiles import LOCAL_BUCKET, LOCAL_REGION, local_store_connection
from pipelines.settings import Settings
from pipelines.storage import S3Connection

#: The bucket Conflux's lake and flow state go to on the local store.
BUCKET = LOCAL_BUCKET
REGION = LOCAL_REGION
#: A small heap; C1 only: the server moves small files and must start in a second or two.
JVM_OPTIONS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
MAIN_CLASS = "org.gaul.s3proxy.Main"


class StoreError(RuntimeError):
    """The store failed to start or is not healthy."""


@dataclass(frozen=True)
class StorePaths:
    root: Path

    @classmethod
    def of(cls, settings: Settings) -> StorePaths:
        return cls(settings.s3_dir)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "logs" / "store.out"

    @property
    def properties(self) -> Path:
        return self.root / "s3proxy.properties"

    @property
    def credentials(self) -> Path:
        return self.root / "credentials.json"

    @property
    def state(self) -> Path:
        return self.root / "store.json"

    @property
    def lock(self) -> Path:
        return self.root / "store.lock"


def jar(settings: Settings) -> Path:
    """The s3proxy jar ``make setup`` fetched (:class:`ConfigError` naming the fix if missing)."""
    return require_jars(settings.jars_dir / "s3proxy", "local S3 store (s3proxy)")[0]


# --------------------------------------------------------------------------- credentials


def credentials(paths: StorePaths, port: int | None = None) -> dict[str, Any]:
    """This installation's access key, secret and port; made on first use, kept (mode 600).

    ``port`` moves the store to another port (saved for the next starts).
    """
    saved = read_json(paths.credentials) or {}
    if {"access_key_id", "secret_access_key", "port"} <= saved.keys() and port in (
        None,
        saved["port"],
    ):
        return saved
    made = {
        "access_key_id": saved.get("access_key_id") or "conflux-" + secrets.token_hex(6),
        "secret_access_key": saved.get("secret_access_key") or secrets.token_urlsafe(30),
        "port": port or saved.get("port") or free_ports(1)[0],
    }
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json(paths.credentials, made, mode=0o600)
    return made


def connection(paths: StorePaths) -> S3Connection:
    """How a client reaches the local store (after its first start)."""
    return local_store_connection(paths.root)


def render_properties(paths: StorePaths, creds: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"s3proxy.endpoint=http://{HOST}:{creds['port']}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={creds['access_key_id']}",
            f"s3proxy.credential={creds['secret_access_key']}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={paths.data}",
            "",
        ]
    )


# --------------------------------------------------------------------------- health


def healthy(conn: S3Connection, timeout: float = 2.0) -> bool:
    """Whether the store answers an authenticated request."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = conn.client(timeout)
    try:
        client.list_buckets()
    except (BotoCoreError, ClientError):
        return False
    return True


def wait_until_healthy(conn: S3Connection, timeout: float, alive: Callable[[], bool]) -> float:
    """Block until the store answers; the seconds waited. :class:`StoreError` if the process
    exits first, :class:`TimeoutError` after ``timeout`` seconds."""
    start = time.monotonic()
    while not healthy(conn):
        if not alive():
            raise StoreError(f"the store process exited before {conn.endpoint} answered")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{conn.endpoint} did not answer within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - start


def ensure_bucket(conn: S3Connection, bucket: str = BUCKET) -> None:
    client = conn.client()
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)


# --------------------------------------------------------------------------- start / stop


def is_our_store(pid: int, paths: StorePaths) -> bool:
    return runs_with(pid, str(paths.properties))


def start_store(
    settings: Settings, port: int | None = None, timeout: float = 60.0
) -> dict[str, Any]:
    """Start the local store, or return the state of the healthy one already running."""
    java = java_executable()
    check_java(java)
    jar_file = jar(settings)
    paths = StorePaths.of(settings)
    with locked(paths.lock):
        state = read_json(paths.state)
        if state and is_our_store(state.get("pid", -1), paths):
            if port is not None and port != state["port"]:
                raise ConfigError(
                    f"the store already runs on port {state['port']} (pid {state['pid']}), not "
                    f"{port}: run `store.py stop` first to move it"
                )
            try:
                wait_until_healthy(connection(paths), timeout, lambda: pid_alive(state["pid"]))
            except TimeoutError as exc:
                raise StoreError(
                    f"{exc}; it runs as pid {state['pid']}: see {state['log_file']}"
                ) from exc
            return {**state, "already_running": True, "healthy": True}
        creds = credentials(paths, port)
        ensure_port_free(creds["port"], "--port", "to use the port saved in credentials.json")
        return _launch(paths, java, jar_file, creds, timeout)


def _launch(
    paths: StorePaths, java: str, jar_file: Path, creds: dict[str, Any], timeout: float
) -> dict[str, Any]:
    paths.data.mkdir(parents=True, exist_ok=True)
    paths.log_file.parent.mkdir(parents=True, exist_ok=True)
    properties = os.open(paths.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(properties, "w") as handle:  # it holds the secret: never readable by others
        handle.write(render_properties(paths, creds))
    command = [java, *JVM_OPTIONS, "-cp", str(jar_file), MAIN_CLASS]
    command += ["--properties", str(paths.properties)]
    offset = paths.log_file.stat().st_size if paths.log_file.exists() else 0
    started = time.monotonic()
    process = spawn_logged(command, paths.log_file, paths.root)
    conn = connection(paths)
    try:
        wait_until_healthy(conn, timeout, lambda: process.poll() is None)
        try:
            ensure_bucket(conn)
        except Exception as exc:  # botocore's: the store answers but refuses the bucket
            raise StoreError(f"creating bucket {BUCKET} at {conn.endpoint} failed: {exc}") from exc
    except BaseException as exc:
        terminate(process.pid, 10.0)
        if not isinstance(exc, TimeoutError | StoreError):
            raise
        tail = log_tail(paths.log_file, offset=offset) or "(nothing new)"
        raise StoreError(f"{exc}\n--- the end of {paths.log_file}:\n{tail}") from exc
    state = {
        "pid": process.pid,
        "port": creds["port"],
        "endpoint": conn.endpoint,
        "region": REGION,
        "bucket": BUCKET,
        "access_key_id": creds["access_key_id"],
        "credentials_file": str(paths.credentials),
        "data_dir": str(paths.data),
        "log_file": str(paths.log_file),
        "started_at": now(),
    }
    write_json(paths.state, state)
    return {**state, "healthy": True, "ready_seconds": round(time.monotonic() - started, 2)}


def stop_store(settings: Settings, timeout: float = 30.0) -> bool:
    """Stop the local store; True if one was running."""
    paths = StorePaths.of(settings)
    with locked(paths.lock):
        state = read_json(paths.state)
        if state is None:
            return False
        live = is_our_store(state.get("pid", -1), paths)
        if live:
            clean = terminate(state["pid"], timeout)
            say(f"store pid {state['pid']} {'stopped' if clean else 'killed'}")
        paths.state.unlink(missing_ok=True)
        return live


def store_status(settings: Settings) -> dict[str, Any]:
    """The store's state plus ``running`` and ``healthy``."""
    paths = StorePaths.of(settings)
    state = read_json(paths.state)
    if state is None:
        return {"running": False, "healthy": False, "state_file": str(paths.state)}
    if not is_our_store(state.get("pid", -1), paths):
        return {**state, "running": False, "healthy": False, "stale": True}
    return {**state, "running": True, "healthy": healthy(connection(paths))}


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="store.py", description="Manage the local S3-compatible store (s3proxy)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start the store (no-op if already healthy)")
    start.add_argument("--port", type=int, help="port (default: the one saved, else a free one)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to become healthy")
    stop = commands.add_parser("stop", help="stop the store")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    commands.add_parser("status", help="print the state; exit 0 only if healthy")
    commands.add_parser("env", help="print CONFLUX_S3_* variables for a shell (with the secret)")
    return parser


def _cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    state = start_store(settings, args.port, args.timeout)
    print_json(state)
    if "ready_seconds" in state:
        say(
            f"S3 store ready at {state['endpoint']} (bucket {BUCKET}) in {state['ready_seconds']} s"
        )
    return 0


def _cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    if not stop_store(settings, args.timeout):
        say(f"no store was running for {StorePaths.of(settings).root}")
    return 0


def _cmd_status(settings: Settings, _args: argparse.Namespace) -> int:
    status = store_status(settings)
    print_json(status)
    return 0 if status["healthy"] else 1


def _cmd_env(settings: Settings, _args: argparse.Namespace) -> int:
    conn = connection(StorePaths.of(settings))
    print(f"export CONFLUX_S3_ENDPOINT={conn.endpoint}")
    print(f"export CONFLUX_S3_REGION={conn.region}")
    print(f"export CONFLUX_S3_ACCESS_KEY_ID={conn.access_key_id}")
    print(f"export CONFLUX_S3_SECRET_ACCESS_KEY={conn.secret_access_key}")
    return 0


_COMMANDS: dict[str, Command] = {
    "start": _cmd_start,
    "stop": _cmd_stop,
    "status": _cmd_status,
    "env": _cmd_env,
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), _COMMANDS, StoreError, argv)


if __name__ == "__main__":
    sys.exit(main())

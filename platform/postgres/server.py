"""Local PostgreSQL server for Conflux's Dagster instance on the cluster profile.

Run it as a script (from any directory)::

    .venv/bin/python platform/postgres/server.py start [--timeout 60]
    .venv/bin/python platform/postgres/server.py stop [--timeout 30]
    .venv/bin/python platform/postgres/server.py status

A private cluster of Debian's PostgreSQL (package ``postgresql``; ``make postgres-install``)
initialised once under ``Settings.postgres_dir`` (``<runtime>/postgres``): the data in ``data/``,
the Unix socket in ``socket/`` (its owner's only), the server log in ``logs/postgres.log``,
``credentials.json`` (mode 600: the port and the password of role :data:`ROLE`, made once, kept
across restarts), ``pgpass`` (mode 600: the same as libpq's password file) and ``server.json``,
the state of the running server. It listens on 127.0.0.1 only, with password (SCRAM)
authentication over TCP. As root it runs as Debian's ``postgres`` user (PostgreSQL refuses to run
as root), which then owns the data folder.

It runs with ``wal_level=logical`` (and room for :data:`REPLICATION_SETTINGS`' replication slots
and WAL senders) for change data capture: Debezium's PostgreSQL connector
(``platform/connect/worker.py``) decodes the WAL with the built-in ``pgoutput`` plugin, nothing
to install. The settings are given on the command line at every start, so a data folder
initialised before they existed gets them at its next start, and a server still running without
them is restarted by ``start`` (both say so).

Each start also writes the cluster profile's Dagster instance (``<runtime>/dagster-cluster``):
``dagster.yaml`` = ``platform/dagster/dagster.yaml``'s policy plus ``storage: postgres`` pointing
at the database :data:`DATABASE` without the password (Dagster's UI shows the instance's
configuration): Dagster's processes read it from the file ``PGPASSFILE`` names (the Makefile
exports it on the cluster profile). dagster-postgres resolves SQLAlchemy 2, whose default
PostgreSQL driver is psycopg 3: the URL names ``psycopg2``.

Machine-readable results (JSON) go to stdout, messages to stderr. Exit codes: 0 success,
1 server failure or not healthy, 2 configuration problem (PostgreSQL not installed, port taken...).
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

import psycopg2
from local_service import (  # platform/services/local_service.py
    HOST,
    Command,
    ensure_port_free,
    free_ports,
    locked,
    log_tail,
    now,
    print_json,
    read_json,
    run_cli,
    say,
    write_json,
)

from pipelines.errors import ConfigError
from pipelines.profiles import Profile, dagster_home
from pipelines.settings import PROJECT_ROOT, Settings

ROLE = "conflux"
DATABASE = "dagster"
#: Debian's system user that owns the data folder when the manager runs as root.
SERVICE_USER = "postgres"
BASE_INSTANCE = PROJECT_ROOT / "platform" / "dagster" / "dagster.yaml"
#: Server settings for logical decoding (CDC): wal_level takes effect only at a (re)start, so
#: they go on the command line of every start rather than into a config file edited once.
#: A replication slot and a WAL sender per connector: 20 leaves room for many beside Dagster.
REPLICATION_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
}


class PostgresError(RuntimeError):
    """The server failed to start or is not healthy."""


@dataclass(frozen=True)
class PostgresPaths:
    root: Path

    @classmethod
    def of(cls, settings: Settings) -> PostgresPaths:
        return cls(settings.postgres_dir)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return self.root / "socket"

    @property
    def log_file(self) -> Path:
        return self.root / "logs" / "postgres.log"

    @property
    def credentials(self) -> Path:
        return self.root / "credentials.json"

    @property
    def state(self) -> Path:
        return self.root / "server.json"

    @property
    def lock(self) -> Path:
        return self.root / "server.lock"

    @property
    def pgpass(self) -> Path:
        """libpq's password file for Dagster's processes (``PGPASSFILE``; mode 600)."""
        return self.root / "pgpass"


def binaries() -> Path:
    """The newest installed PostgreSQL's ``bin`` folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise ConfigError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): run "
            "`make postgres-install` (Debian's postgresql package, as root or with sudo)"
        )
    return found[-1].parent


def credentials(paths: PostgresPaths) -> dict[str, Any]:
    """The port and password of this installation; made on first use, kept (mode 600) and
    written as a libpq password file (:attr:`PostgresPaths.pgpass`) for Dagster's processes."""
    saved = read_json(paths.credentials) or {}
    if {"port", "password"} <= saved.keys():
        return saved
    if (paths.data / "PG_VERSION").exists():
        raise ConfigError(
            f"{paths.credentials} is missing but {paths.data} holds a database whose password "
            "was in it: restore the file, or stop the server and delete the data folder to start "
            "afresh (Dagster's runs and event log on it are lost)"
        )
    made = {"port": free_ports(1)[0], "password": secrets.token_urlsafe(24)}
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json(paths.credentials, made, mode=0o600)
    return made


def database_url(paths: PostgresPaths) -> str:
    """The SQLAlchemy URL of Dagster's database: no password in it (libpq reads it from the
    file ``PGPASSFILE`` names), so Dagster's instance config, which its UI shows, holds none."""
    return f"postgresql+psycopg2://{ROLE}@{HOST}:{credentials(paths)['port']}/{DATABASE}"


def write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically, readable by its owner only (it names or holds a secret)."""
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name)
    with os.fdopen(descriptor, "w") as handle:  # mkstemp: mode 600 from the start
        handle.write(text)
    os.replace(partial, path)


def write_pgpass(paths: PostgresPaths) -> Path:
    creds = credentials(paths)
    write_private(paths.pgpass, f"{HOST}:{creds['port']}:*:{ROLE}:{creds['password']}\n")
    return paths.pgpass


def _as_service_user() -> list[str]:
    """The prefix that runs a PostgreSQL program as :data:`SERVICE_USER` when we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        raise ConfigError(
            f"running as root, but there is no {SERVICE_USER!r} user to run PostgreSQL as: "
            "install Debian's postgresql package (make postgres-install)"
        ) from None
    return ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups"]


def _run(command: list[str], what: str) -> str:
    done = subprocess.run([*_as_service_user(), *command], capture_output=True, text=True)
    if done.returncode != 0:
        raise PostgresError(f"{what} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _own(paths: PostgresPaths) -> None:
    """Give the data, socket and log folders to the service user (root only)."""
    if os.geteuid() != 0:
        return
    user = pwd.getpwnam(SERVICE_USER)
    for folder in (paths.data, paths.socket, paths.log_file.parent):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, user.pw_uid, user.pw_gid)
        os.chmod(folder, 0o700)
        for child in folder.rglob("*"):
            os.lchown(child, user.pw_uid, user.pw_gid)


def ensure_initialised(paths: PostgresPaths, bin_dir: Path) -> bool:
    """``initdb`` the data folder unless it holds a cluster; True if it was made now."""
    if (paths.data / "PG_VERSION").exists():
        return False
    paths.data.mkdir(parents=True, exist_ok=True)
    _own(paths)
    _check_reachable(paths)
    with tempfile.NamedTemporaryFile("w", dir=paths.root, delete=False) as pwfile:
        pwfile.write(credentials(paths)["password"] + "\n")
    try:
        if os.geteuid() == 0:  # read once by initdb as the service user (mode 600); removed below
            user = pwd.getpwnam(SERVICE_USER)
            os.chown(pwfile.name, user.pw_uid, user.pw_gid)
        _run(
            [str(bin_dir / "initdb"), "-D", str(paths.data), "-U", ROLE, "-E", "UTF8",
             "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile.name}",
             "--no-instructions"],
            "initdb",
        )  # fmt: skip
    finally:
        os.unlink(pwfile.name)
    return True


def _check_reachable(paths: PostgresPaths) -> None:
    """As root, the service user must reach the data folder (every folder above it searchable)."""
    if os.geteuid() != 0:
        return
    probe = subprocess.run([*_as_service_user(), "test", "-w", str(paths.data)], check=False)
    if probe.returncode != 0:
        raise ConfigError(
            f"PostgreSQL runs as the {SERVICE_USER!r} user, which cannot reach {paths.data}: "
            "make every folder above it searchable by others (chmod o+x), or set "
            "CONFLUX_RUNTIME_DIR to a folder it can reach"
        )


def _pg_ctl(bin_dir: Path, paths: PostgresPaths, *args: str) -> list[str]:
    return [str(bin_dir / "pg_ctl"), "-D", str(paths.data), *args]


def server_pid(paths: PostgresPaths) -> int | None:
    """The postmaster's pid while it runs (the first line of ``postmaster.pid``)."""
    try:
        pid = int((paths.data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def healthy(paths: PostgresPaths, timeout: float = 3.0) -> bool:
    """Whether the server accepts a password login to Dagster's database over TCP."""
    creds = credentials(paths)
    try:
        psycopg2.connect(
            host=HOST, port=creds["port"], user=ROLE, password=creds["password"],
            dbname=DATABASE, connect_timeout=max(1, int(timeout)),
        ).close()  # fmt: skip
    except psycopg2.Error:
        return False
    return True


def ensure_database(paths: PostgresPaths) -> None:
    creds = credentials(paths)
    conn = psycopg2.connect(
        host=HOST, port=creds["port"], user=ROLE, password=creds["password"], dbname="postgres"
    )
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        conn.close()


def write_dagster_instance(settings: Settings, paths: PostgresPaths) -> Path:
    """The cluster profile's ``dagster.yaml``: the embedded one's policy, storage on PostgreSQL
    (no password in it: Dagster's processes find it in ``PGPASSFILE``)."""
    home = dagster_home(settings.runtime_dir, Profile.CLUSTER)
    home.mkdir(parents=True, exist_ok=True)
    policy = [line for line in BASE_INSTANCE.read_text().splitlines() if line.strip()]
    while policy and policy[0].startswith("#"):
        policy.pop(0)  # the embedded instance's own header
    text = "\n".join(
        [
            "# The cluster profile's Dagster instance, written by platform/postgres/server.py at",
            "# each start: platform/dagster/dagster.yaml's policy, storage on PostgreSQL. Every",
            f"# Dagster process needs PGPASSFILE={paths.pgpass} (the Makefile exports it).",
            *policy,
            "storage:",
            "  postgres:",
            f'    postgres_url: "{database_url(paths)}"',
            "",
        ]
    )
    target = home / "dagster.yaml"
    write_private(target, text)
    return target


def start_server(settings: Settings, timeout: float = 60.0) -> dict[str, Any]:
    """Start the server (initialising it on first use), or report the healthy one running (a
    running server without logical decoding is restarted with it); the Dagster instance and the
    password file are written either way."""
    bin_dir = binaries()
    paths = PostgresPaths.of(settings)
    with locked(paths.lock):
        started = time.monotonic()
        initialised, offset = False, _log_size(paths)
        pid = server_pid(paths)
        if pid is None:
            initialised = _start_postmaster(bin_dir, paths, timeout)
        try:
            ensure_database(paths)
            if pid is not None and _restart_for_replication(bin_dir, paths, pid, timeout):
                pid = None  # restarted now: a new start time, ready_seconds reported
        except psycopg2.Error as exc:
            tail = log_tail(paths.log_file, offset=offset) or "(nothing new)"
            raise PostgresError(
                f"the server (pid {server_pid(paths)}) does not let role {ROLE} in: "
                f"{str(exc).strip()}; restart it (make postgres-stop postgres-start)\n"
                f"--- the end of {paths.log_file}:\n{tail}"
            ) from exc
        write_pgpass(paths)
        instance = write_dagster_instance(settings, paths)
        state = {
            "pid": server_pid(paths),
            "port": credentials(paths)["port"],
            "host": HOST,
            "role": ROLE,
            "database": DATABASE,
            "version": bin_dir.parent.name,
            "initialised_now": initialised,
            "replication": replication_settings(paths),
            "data_dir": str(paths.data),
            "log_file": str(paths.log_file),
            "dagster_instance": str(instance),
            "pgpassfile": str(paths.pgpass),
            "started_at": now()
            if pid is None
            else (read_json(paths.state) or {}).get("started_at"),
        }
        write_json(paths.state, state)
        if pid is not None:
            return {**state, "already_running": True, "healthy": True}
        return {**state, "healthy": True, "ready_seconds": round(time.monotonic() - started, 2)}


def _server_options(paths: PostgresPaths, port: int) -> str:
    """The postmaster's command-line options: loopback only, the private socket folder, and
    :data:`REPLICATION_SETTINGS`."""
    replication = " ".join(f"-c {name}={value}" for name, value in REPLICATION_SETTINGS.items())
    return (
        f"-c listen_addresses={HOST} -p {port} -k {paths.socket} "
        f"-c unix_socket_permissions=0700 {replication}"
    )


def _start_postmaster(bin_dir: Path, paths: PostgresPaths, timeout: float) -> bool:
    """Start a stopped server (``initdb`` first on first use); True if it was initialised now."""
    creds = credentials(paths)
    ensure_port_free(creds["port"], "port", "(stop whatever listens on it)")
    initialised = ensure_initialised(paths, bin_dir)
    _own(paths)
    last = None if initialised else _last_wal_level(bin_dir, paths)
    if last is not None and last != REPLICATION_SETTINGS["wal_level"]:
        say(
            f"{paths.data} last ran with wal_level={last}: from this start on it runs with "
            "wal_level=logical, for change data capture (Debezium's pgoutput decoding)"
        )
    _run(
        _pg_ctl(bin_dir, paths, "-l", str(paths.log_file), "-o",
                _server_options(paths, creds["port"]), "-w", "-t", str(int(timeout)), "start"),
        "pg_ctl start",
    )  # fmt: skip
    return initialised


def _last_wal_level(bin_dir: Path, paths: PostgresPaths) -> str | None:
    """The ``wal_level`` the data folder last ran with (``pg_controldata``), None if unknown."""
    try:
        output = _run([str(bin_dir / "pg_controldata"), "-D", str(paths.data)], "pg_controldata")
    except (PostgresError, OSError):
        return None
    for line in output.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "wal_level setting":
            return value.strip()
    return None


def replication_settings(paths: PostgresPaths) -> dict[str, str]:
    """The running server's values of :data:`REPLICATION_SETTINGS`."""
    creds = credentials(paths)
    conn = psycopg2.connect(
        host=HOST, port=creds["port"], user=ROLE, password=creds["password"], dbname=DATABASE
    )
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (list(REPLICATION_SETTINGS),),
            )
            return dict(cursor.fetchall())
    finally:
        conn.close()


def _restart_for_replication(bin_dir: Path, paths: PostgresPaths, pid: int, timeout: float) -> bool:
    """Restart a running server that lacks logical decoding (started by an earlier version of
    this manager, or by hand); True if it was restarted."""
    current = replication_settings(paths)
    if current.get("wal_level") == REPLICATION_SETTINGS["wal_level"]:
        return False
    say(
        f"PostgreSQL (pid {pid}) runs with wal_level={current.get('wal_level')}: restarting it "
        "with wal_level=logical for change data capture (open sessions, Dagster's too, are ended)"
    )
    creds = credentials(paths)
    _run(
        _pg_ctl(bin_dir, paths, "-l", str(paths.log_file), "-o",
                _server_options(paths, creds["port"]), "-m", "fast", "-w",
                "-t", str(int(timeout)), "restart"),
        "pg_ctl restart",
    )  # fmt: skip
    return True


def _log_size(paths: PostgresPaths) -> int:
    return paths.log_file.stat().st_size if paths.log_file.exists() else 0


def stop_server(settings: Settings, timeout: float = 30.0) -> bool:
    """Stop the server (fast shutdown: open sessions are ended); True if one was running."""
    paths = PostgresPaths.of(settings)
    with locked(paths.lock):
        if server_pid(paths) is None:
            paths.state.unlink(missing_ok=True)
            return False
        _run(
            _pg_ctl(binaries(), paths, "-m", "fast", "-w", "-t", str(int(timeout)), "stop"),
            "pg_ctl stop",
        )
        paths.state.unlink(missing_ok=True)
        return True


def server_status(settings: Settings) -> dict[str, Any]:
    paths = PostgresPaths.of(settings)
    state = read_json(paths.state) or {}
    pid = server_pid(paths)
    if pid is None:
        return {**state, "running": False, "healthy": False, "state_file": str(paths.state)}
    return {**state, "pid": pid, "running": True, "healthy": healthy(paths)}


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="server.py", description="Manage the local PostgreSQL server (Dagster's storage)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start the server (no-op if already healthy)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to become ready")
    stop = commands.add_parser("stop", help="stop the server")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to shut down")
    commands.add_parser("status", help="print the state; exit 0 only if healthy")
    return parser


def _cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    state = start_server(settings, args.timeout)
    print_json(state)
    if "ready_seconds" in state:
        say(
            f"PostgreSQL {state['version']} ready on {HOST}:{state['port']} (database "
            f"{DATABASE}) in {state['ready_seconds']} s; Dagster instance {state['dagster_instance']}"
        )
    wal = state["replication"]
    say(
        f"wal_level={wal.get('wal_level')}, max_replication_slots={wal.get('max_replication_slots')}"
        f", max_wal_senders={wal.get('max_wal_senders')}: ready for Debezium (pgoutput)"
    )
    return 0


def _cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    if not stop_server(settings, args.timeout):
        say(f"no PostgreSQL server was running for {PostgresPaths.of(settings).data}")
    return 0


def _cmd_status(settings: Settings, _args: argparse.Namespace) -> int:
    status = server_status(settings)
    print_json(status)
    return 0 if status["healthy"] else 1


_COMMANDS: dict[str, Command] = {
    "start": _cmd_start,
    "stop": _cmd_stop,
    "status": _cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), _COMMANDS, PostgresError, argv)


if __name__ == "__main__":
    sys.exit(main())

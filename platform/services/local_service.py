"""What every local service manager of ``platform/`` shares (the Kafka broker, the S3 store):
processes found by pid and command line, stopped politely then firmly, state kept as JSON beside
their data, start and stop serialised by a lock file, free ports on loopback, log tails.

Managers import it with their own folder's parent on ``sys.path`` (``platform/`` is a folder of
scripts, not a package: the name would shadow Python's ``platform`` module).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.errors import ConfigError
from pipelines.profiles import Profile
from pipelines.settings import Settings, load_settings

HOST = "127.0.0.1"
LOG_TAIL_LINES = 30


def say(message: str) -> None:
    """A message for the person at the terminal (stderr: stdout carries the JSON)."""
    print(message, file=sys.stderr, flush=True)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str:
    """The one-letter state from ``/proc/<pid>/stat`` ("" where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; zombies count as dead (an orphan may never be reaped by PID 1).
    ``pid`` <= 0 (a missing or damaged state file) is never alive: ``kill(-1, 0)`` would succeed."""
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it happens to be our own child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _proc_state(pid) not in ("Z", "X")


def runs_with(pid: int, *arguments: str) -> bool:
    """Whether ``pid`` is alive and its command line holds every one of ``arguments`` (so a
    recycled pid is not taken for the service)."""
    if not pid_alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    args = [arg.decode(errors="replace") for arg in argv]
    return all(argument in args for argument in arguments)


def terminate(pid: int, timeout: float) -> bool:
    """SIGTERM ``pid`` (the service shuts down cleanly), SIGKILL its group after ``timeout``.

    Returns True when it exited on SIGTERM alone.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, timeout):
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # started with start_new_session: pgid == pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 10.0)
    return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


#: The signals a service is stopped with (:func:`terminate` sends the first).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def spawn_logged(
    command: list[str], log_file: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (so its group can be killed), its output
    appended to ``log_file`` after a line saying when and what was started (``env``: its whole
    environment; default this process's). The service answers SIGTERM and SIGINT even if this
    process ignores them (:func:`_stop_signals_at_default`)."""
    ignored = [s for s in STOP_SIGNALS if signal.getsignal(s) is signal.SIG_IGN]
    with log_file.open("ab") as out:
        out.write(f"\n=== {now()} starting: {' '.join(command)}\n".encode())
        out.flush()
        return subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            # the managers that call this are single-threaded scripts: preexec_fn is safe there
            preexec_fn=_stop_signals_at_default if ignored else None,
        )


def _stop_signals_at_default() -> None:
    """In the service's process, before exec: SIGTERM and SIGINT back at their defaults.

    An ignored signal stays ignored across exec, and a JVM that starts with SIGTERM ignored never
    installs its shutdown handler: started from a shell script's background job (SIGINT ignored)
    through Dagster (which points SIGTERM at SIGINT's handler), a broker or store would never
    stop on :func:`terminate`'s SIGTERM, only on the SIGKILL after its timeout, uncleanly."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


# --------------------------------------------------------------------------- state and logs


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if missing, ``{}`` if unreadable."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any], mode: int = 0o644) -> None:
    """Write ``path`` atomically (``mode``: 0o600 for a file holding a secret)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, offset: int = 0) -> str:
    """The last ``lines`` lines of ``path`` after byte ``offset`` ("" if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Serialise start/stop of one runtime's service across processes."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- ports


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1, chosen by the OS (bind to port 0)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


def ensure_port_free(port: int, option: str, otherwise: str = "to get a free port") -> None:
    """Raise :class:`ConfigError` naming ``port`` and the fix unless it can be bound
    (``otherwise``: what leaving ``option`` out does)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise ConfigError(
                f"port {port} on {HOST} is already in use ({exc.strerror}): stop whatever "
                f"listens there, pass another {option} N, or leave {option} out {otherwise}"
            ) from exc


# --------------------------------------------------------------------------- command line

#: A manager's command: the settings and the parsed arguments in, the exit code out.
Command = Callable[[Settings, argparse.Namespace], int]


def print_json(data: dict[str, Any]) -> None:
    """A machine-readable result, on stdout."""
    print(json.dumps(data, indent=2), flush=True)


def run_cli(
    parser: argparse.ArgumentParser,
    commands: dict[str, Command],
    failure: type[Exception],
    argv: Sequence[str] | None,
) -> int:
    """Run the command ``argv`` names; the exit code: the command's, 2 for a configuration
    problem (missing Java or jars, port taken...), 1 for ``failure`` (the service's own)."""
    args = parser.parse_args(argv)
    try:
        return commands[args.command](load_settings(profile=Profile.LOCAL), args)
    except ConfigError as exc:
        say(f"error: {exc}")
        return 2
    except failure as exc:
        say(f"error: {exc}")
        return 1

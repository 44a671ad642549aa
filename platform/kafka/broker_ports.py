"""The local broker's ports, recorded with its storage: the first start picks them, every later
start with the same storage listens on them again.

Why: a client keeps the bootstrap address it was given (a flow configured with it, a continuous
run that outlives ``make broker-stop`` / ``make broker-start``); a broker that came back on
another port would leave it retrying a dead address. So the ports live in ``ports.json`` beside
``broker.json`` (which goes away on stop) in the folder that holds the KRaft log dirs, and a start
whose recorded port is taken refuses, naming the port, its holder and the fix, instead of quietly
moving. Deleting ``ports.json`` (or the whole folder, topics included) lets the next start pick
anew; ``--port`` / ``--controller-port`` move the broker on purpose and are recorded in turn.

New ports are picked below the kernel's ephemeral range (``ip_local_port_range``): a port from
that range, free while the broker is stopped, may be handed meanwhile to any outgoing connection,
and the next start would then have to refuse.

Imported by ``broker.py``, with ``platform/services`` on ``sys.path`` (see local_service.py).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from local_service import HOST, ensure_port_free, free_ports, now, read_json, write_json

from pipelines.errors import ConfigError

#: Lowest port a first start picks; up to the ephemeral range's start (32768 on Linux).
PICK_FLOOR = 20000
#: Fewer ports than this below the ephemeral range: pick from the OS instead (bind to port 0).
MIN_PICK_RANGE = 1000
PICK_ATTEMPTS = 200
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_NOTE = (
    "Written by platform/kafka/broker.py at the broker's first start (and when --port or "
    "--controller-port moves it): every later start listens on these ports. Delete this file "
    "to let the next start pick new free ports."
)
_SS_USER = re.compile(r'users:\(\("(?P<name>[^"]*)",pid=(?P<pid>\d+)')


@dataclass(frozen=True)
class BrokerPorts:
    """Where the broker listens: clients on ``port``, its KRaft controller on ``controller_port``."""

    port: int
    controller_port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"


# --------------------------------------------------------------------------- the record


def read_recorded(ports_file: Path) -> BrokerPorts | None:
    """The ports recorded in ``ports_file``; None before the first start.

    A damaged file is refused rather than ignored: ignoring it would move the broker silently.
    """
    data = read_json(ports_file)
    if data is None:
        return None
    values = [_recorded_port(data, field, ports_file) for field in ("port", "controller_port")]
    if values[0] == values[1]:
        raise ConfigError(
            f"{ports_file} records port {values[0]} as both `port` and `controller_port`: "
            "fix one, or delete the file to pick new free ports at the next start"
        )
    return BrokerPorts(*values)


def _recorded_port(data: dict[str, Any], field: str, ports_file: Path) -> int:
    value = data.get(field)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    raise ConfigError(
        f"{ports_file} is damaged: `{field}` is {value!r}, not a TCP port (1-65535); fix it, "
        "or delete the file to pick new free ports at the next start"
    )


def record_ports(ports_file: Path, ports: BrokerPorts) -> None:
    """Write ``ports_file`` atomically."""
    document = {
        "port": ports.port,
        "controller_port": ports.controller_port,
        "bootstrap_servers": ports.bootstrap_servers,
        "recorded_at": now(),
        "note": PORTS_NOTE,
    }
    write_json(ports_file, document)


# --------------------------------------------------------------------------- choosing


def select_ports(
    port: int | None, controller_port: int | None, ports_file: Path | None = None
) -> BrokerPorts:
    """The ports of the next start. For each of the two: the one given on the command line, else
    the one recorded in ``ports_file``, else a newly picked free one. A given or recorded port
    must be free now: :class:`ConfigError` names it and the fix otherwise."""
    if port is not None and port == controller_port:
        raise ConfigError(f"--port and --controller-port are both {port}: they must differ")
    recorded = read_recorded(ports_file) if ports_file is not None else None
    kept = (recorded.port, recorded.controller_port) if recorded else (None, None)
    chosen = (
        kept[0] if port is None else port,
        kept[1] if controller_port is None else controller_port,
    )
    if chosen[0] is not None and chosen[0] == chosen[1]:
        raise ConfigError(
            f"the client and controller ports would both be {chosen[0]} (one given, the other "
            f"recorded in {ports_file}): they must differ; pass both --port and --controller-port"
        )
    for value, given, option in zip(
        chosen, (port, controller_port), ("--port", "--controller-port"), strict=True
    ):
        if given is not None:
            ensure_port_free(given, option, "to keep the recorded port (or pick a free one)")
        elif value is not None and ports_file is not None:
            ensure_recorded_port_free(value, option, ports_file)
    spare = iter(p for p in pick_ports(3) if p not in chosen)
    return BrokerPorts(chosen[0] or next(spare), chosen[1] or next(spare))


def ensure_recorded_port_free(port: int, option: str, ports_file: Path) -> None:
    """Refuse to start when a recorded port is taken: moving would strand the clients that were
    given the broker's address. The message names the port, what holds it and the fixes."""
    try:
        ensure_port_free(port, option)
    except ConfigError as exc:
        role = "client" if option == "--port" else "controller"
        holder = port_holder(port)
        held = (
            f"held by {holder}"
            if holder
            else f"in use (to see by what: ss -ltnp 'sport = :{port}')"
        )
        raise ConfigError(
            f"port {port} on {HOST}, the broker's {role} port recorded in {ports_file}, is {held}. "
            "The broker keeps its ports across restarts so that clients given its address "
            f"reconnect. Fix: free port {port} and start again; or delete {ports_file} (or reset "
            f"the whole storage, {ports_file.parent}, topics included) so that the next start "
            f"picks new free ports; or run `platform/kafka/broker.py start {option} N`. After "
            "either of the last two, clients must be given the new address."
        ) from exc


def pick_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, below the ephemeral range when it leaves
    room (see the module docstring), else chosen by the OS."""
    ceiling = _ephemeral_floor()
    if ceiling is None or ceiling - PICK_FLOOR < MIN_PICK_RANGE:
        return free_ports(count)
    found: list[int] = []
    for candidate in random.sample(range(PICK_FLOOR, ceiling), PICK_ATTEMPTS):
        if _bindable(candidate):
            found.append(candidate)
            if len(found) == count:
                return found
    return free_ports(count)


def _ephemeral_floor() -> int | None:
    """The first port of the kernel's ephemeral range (None where there is no /proc)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    try:
        ensure_port_free(port, "--port")
    except ConfigError:
        return False
    return True


# --------------------------------------------------------------------------- who holds a port


def port_holder(port: int) -> str | None:
    """Who holds TCP ``port``, as ``ss`` sees it (None if unknown: no ``ss``, nothing found, or a
    process of another user, which ``ss`` does not name). A listener is named before a mere
    connection."""
    try:
        found = subprocess.run(
            ["ss", "-Htanp", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=3,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = sorted(found.stdout.splitlines(), key=lambda line: not line.startswith("LISTEN"))
    for line in lines:
        match = _SS_USER.search(line)
        if match:
            how = "" if line.startswith("LISTEN") else f", a connection in state {line.split()[0]}"
            return _describe(int(match["pid"]), match["name"]) + how
    return None


def _describe(pid: int, name: str) -> str:
    """``pid`` and what it is: another Kafka broker is named with its properties file."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        raw = ""
    argv = [arg for arg in raw.split("\0") if arg]
    if "kafka.Kafka" in argv and argv[-1] != "kafka.Kafka":
        return f"another Kafka broker, pid {pid}, run on {argv[-1]}"
    return f"pid {pid} ({name})"

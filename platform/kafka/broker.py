"""Local single-node Kafka broker (KRaft, combined broker + controller) for Conflux.

Run it as a script (from any directory; it puts the project root on ``sys.path``)::

    .venv/bin/python platform/kafka/broker.py start [--port N] [--controller-port N] [--timeout 60]
    .venv/bin/python platform/kafka/broker.py stop [--timeout 30]
    .venv/bin/python platform/kafka/broker.py status [--timeout 5]
    .venv/bin/python platform/kafka/broker.py wait [--timeout 60]

Everything lives under ``Settings.broker_dir`` (``<runtime>/kafka``): ``server.properties``,
``cluster.id``, the log data in ``data/``, the logs in ``logs/`` (``broker.out`` holds the JVM's
stdout/stderr and every WARN+ line, ``server.log`` the full INFO log), ``broker.json``, the
state of the running broker, and ``ports.json``, the ports picked at the first start. Data and
ports survive restarts: every later start listens where the first did, or refuses if that port
is taken (see broker_ports.py).

Machine-readable results (JSON) go to stdout, messages to stderr. Exit codes: 0 success,
1 broker failure or not healthy, 2 configuration problem (missing Java or jars, port taken...).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_ports import BrokerPorts, read_recorded, record_ports, select_ports
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from local_service import (  # platform/services/local_service.py
    HOST,
    LOG_TAIL_LINES,
    Command,
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
from pipelines.settings import Settings

NODE_ID = 1
LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
JVM_OPTIONS = ("-Xmx512m", "-Xms256m", "-XX:+UseG1GC")
PROBE_SECONDS = 2.0
#: Largest record batch the local broker accepts (``message.max.bytes``), see render_properties.
MAX_RECORD_BYTES = 8 * 1024 * 1024


class BrokerError(RuntimeError):
    """The broker failed to start, died, or did not become healthy in time."""


@dataclass(frozen=True)
class BrokerPaths:
    """The files of the local broker under ``Settings.broker_dir``."""

    root: Path

    @classmethod
    def of(cls, settings: Settings) -> BrokerPaths:
        return cls(settings.broker_dir)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def log_file(self) -> Path:
        return self.logs / "broker.out"

    @property
    def server_log(self) -> Path:
        return self.logs / "server.log"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def state(self) -> Path:
        return self.root / "broker.json"

    @property
    def ports(self) -> Path:
        return self.root / "ports.json"

    @property
    def cluster_id(self) -> Path:
        return self.root / "cluster.id"

    @property
    def lock(self) -> Path:
        return self.root / ".broker.lock"


# --------------------------------------------------------------------------- configuration


def render_properties(port: int, controller_port: int, data_dir: Path) -> str:
    """``server.properties`` of a single-node combined KRaft broker listening on 127.0.0.1.

    The controller quorum is a static voter set of one node, so the controller port may change
    between restarts (``--controller-port``, a deleted ``ports.json``) without touching the stored
    metadata.

    Record size: Kafka's default ``message.max.bytes`` (about 1 MB) rejects larger records with
    ``MSG_SIZE_TOO_LARGE``. Bronze keeps whatever bytes a source sends, so the local broker accepts
    record batches up to :data:`MAX_RECORD_BYTES` (8 MiB); a topic may lower it with its own
    ``max.message.bytes``. ``replica.fetch.max.bytes`` is raised to match: with one node nothing
    is replicated, but a follower must always be able to fetch the largest batch the leader
    accepts, so the two stay consistent if the broker ever grows a replica. Consumers are not
    limited by it (a fetch always returns at least one whole batch, whatever its size).
    """
    values = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir).replace("\\", "\\\\"),
        "offsets.topic.replication.factor": 1,
        # 5 instead of 50 partitions: the first consumer group on a fresh broker is ready sooner.
        "offsets.topic.num.partitions": 5,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 5,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        "message.max.bytes": MAX_RECORD_BYTES,
        "replica.fetch.max.bytes": MAX_RECORD_BYTES,
    }
    header = "# Written by platform/kafka/broker.py on every start: edits are overwritten.\n"
    return header + "".join(f"{key}={value}\n" for key, value in values.items())


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as ``Uuid``)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka avoids ids that look like a command-line flag
            return text


def read_meta_cluster_id(data_dir: Path) -> str | None:
    """The ``cluster.id`` recorded in ``meta.properties`` of a formatted log dir, if any."""
    meta = data_dir / "meta.properties"
    if not meta.exists():
        return None
    for line in meta.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id":
            return value.strip()
    return None


# --------------------------------------------------------------------------- processes


def is_our_broker(pid: int, paths: BrokerPaths) -> bool:
    """Whether ``pid`` is alive and is ``kafka.Kafka`` run on this runtime's properties file."""
    return runs_with(pid, "kafka.Kafka", str(paths.properties))


# --------------------------------------------------------------------------- state


def read_state(paths: BrokerPaths) -> dict[str, Any] | None:
    """The content of ``broker.json``; None if missing, ``{}`` if unreadable."""
    return read_json(paths.state)


def write_state(paths: BrokerPaths, state: dict[str, Any]) -> None:
    """Write ``broker.json`` atomically."""
    write_json(paths.state, state)


def state_is_live(state: dict[str, Any], paths: BrokerPaths) -> bool:
    """Whether the state names a broker process that still runs."""
    pid = state.get("pid")
    return isinstance(pid, int) and is_our_broker(pid, paths)


def _locked(paths: BrokerPaths) -> contextlib.AbstractContextManager[None]:
    """Serialise start/stop of one runtime's broker across processes."""
    return locked(paths.lock)


# --------------------------------------------------------------------------- health


def probe(bootstrap: str, timeout: float) -> bool:
    """Whether a metadata request to ``bootstrap`` succeeds within ``timeout`` seconds."""
    return _metadata_ok(_admin(bootstrap), timeout)


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "log_level": 0,  # silence "connection refused" while the broker boots
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 500,
        }
    )


def _metadata_ok(admin: AdminClient, timeout: float) -> bool:
    try:
        metadata = admin.list_topics(timeout=max(timeout, 0.1))
    except KafkaException:
        return False
    return bool(metadata.brokers)


def wait_until_healthy(
    bootstrap: str, timeout: float, alive: Callable[[], bool] | None = None
) -> float:
    """Block until the broker at ``bootstrap`` answers metadata requests.

    Returns the seconds waited. Raises :class:`TimeoutError` after ``timeout`` seconds, or
    :class:`BrokerError` as soon as ``alive()`` (if given) returns False.
    """
    start = time.monotonic()
    admin = _admin(bootstrap)
    while True:
        remaining = start + timeout - time.monotonic()
        if alive is not None and not alive():
            raise BrokerError(f"the broker process exited before {bootstrap} became healthy")
        if remaining <= 0:
            raise TimeoutError(f"{bootstrap} not healthy after {timeout:.0f} s")
        if _metadata_ok(admin, min(remaining, PROBE_SECONDS)):
            return time.monotonic() - start
        time.sleep(0.1)


# --------------------------------------------------------------------------- start


def start_broker(
    settings: Settings,
    port: int | None = None,
    timeout: float = 60.0,
    controller_port: int | None = None,
) -> dict[str, Any]:
    """Start the local broker, or return the state of the healthy one already running.

    Without ``port`` / ``controller_port`` it listens on the ports recorded in ``ports.json``
    (picked free at the first start); given, they move it and are recorded once it is healthy.
    The ports are checked first, before Java and the jars: a refusal costs no JVM.
    Raises :class:`ConfigError` (ports, Java, jars) or :class:`BrokerError` (failed start).
    """
    paths = BrokerPaths.of(settings)
    with _locked(paths):
        running = _live_state(paths)
        if running is not None:
            return _reuse(running, paths, port, timeout)
        ports = select_ports(port, controller_port, paths.ports)
        java = java_executable()
        check_java(java)
        require_jars(settings.kafka_jars_dir, "Kafka broker")
        return _launch(settings, paths, java, ports, timeout)


def _live_state(paths: BrokerPaths) -> dict[str, Any] | None:
    """The state of the running broker; a stale ``broker.json`` is removed."""
    state = read_state(paths)
    if state is None:
        return None
    if state_is_live(state, paths):
        return state
    say(f"removing stale {paths.state} (process {state.get('pid')} is gone)")
    paths.state.unlink(missing_ok=True)
    return None


def _reuse(
    state: dict[str, Any], paths: BrokerPaths, port: int | None, timeout: float
) -> dict[str, Any]:
    if port is not None and port != state["port"]:
        raise ConfigError(
            f"the broker already runs on port {state['port']} (pid {state['pid']}), not {port}: "
            "run `broker.py stop` first to move it"
        )
    say(f"broker already running (pid {state['pid']}) at {state['bootstrap_servers']}")
    try:
        wait_until_healthy(state["bootstrap_servers"], timeout, lambda: pid_alive(state["pid"]))
    except (TimeoutError, BrokerError) as exc:
        raise BrokerError(f"{exc}; it runs as pid {state['pid']}: see {state['log_file']}") from exc
    if read_recorded(paths.ports) is None:  # started before ports were recorded
        record_ports(paths.ports, BrokerPorts(state["port"], state["controller_port"]))
    return {**state, "already_running": True, "healthy": True, "ports_file": str(paths.ports)}


def _launch(
    settings: Settings, paths: BrokerPaths, java: str, ports: BrokerPorts, timeout: float
) -> dict[str, Any]:
    classpath = str(settings.kafka_jars_dir / "*")
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.properties.write_text(render_properties(ports.port, ports.controller_port, paths.data))
    formatted = ensure_formatted(paths, java, classpath)
    offsets = _log_sizes(paths)
    started = time.monotonic()
    process = _spawn(paths, java, classpath)
    state = _new_state(paths, process.pid, ports)
    write_state(paths, state)
    try:
        wait_until_healthy(state["bootstrap_servers"], timeout, lambda: process.poll() is None)
    except (TimeoutError, BrokerError) as exc:
        _abort(paths, process.pid)
        raise BrokerError(f"{exc}\n{_tail_report(paths, offsets)}") from exc
    ready = round(time.monotonic() - started, 2)
    _remember(paths, ports)
    return {
        **state,
        "healthy": True,
        "formatted_storage": formatted,
        "ready_seconds": ready,
        "ports_file": str(paths.ports),
    }


def _remember(paths: BrokerPaths, ports: BrokerPorts) -> None:
    """Record the ports of a healthy start (only then: a start that failed on a port it had
    just picked must not make the next one insist on it)."""
    recorded = read_recorded(paths.ports)
    if recorded == ports:
        return
    record_ports(paths.ports, ports)
    if recorded is None:
        say(
            f"recorded ports {ports.port} (clients) and {ports.controller_port} (controller) in "
            f"{paths.ports}: every later start listens there"
        )
    elif recorded.port != ports.port:
        say(
            f"the broker moved from {recorded.bootstrap_servers} to {ports.bootstrap_servers} "
            f"(recorded in {paths.ports}): clients given the old address must be changed"
        )


def ensure_formatted(paths: BrokerPaths, java: str, classpath: str) -> bool:
    """Format the log dir with ``StorageTool`` unless done already; True if it formatted."""
    existing = read_meta_cluster_id(paths.data)
    if existing is not None:
        paths.cluster_id.write_text(existing + "\n")
        return False
    cluster_id = _stored_cluster_id(paths) or new_cluster_id()
    paths.cluster_id.write_text(cluster_id + "\n")
    command = [java, "-cp", classpath, "kafka.tools.StorageTool", "format"]
    command += ["-t", cluster_id, "-c", str(paths.properties)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise BrokerError(f"formatting {paths.data} failed:\n{output}")
    return True


def _stored_cluster_id(paths: BrokerPaths) -> str | None:
    if not paths.cluster_id.exists():
        return None
    return paths.cluster_id.read_text().strip() or None


def _spawn(paths: BrokerPaths, java: str, classpath: str) -> subprocess.Popen[bytes]:
    command = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
    command += [f"-Dkafka.logs.dir={paths.logs}", "-cp", classpath]
    command += ["kafka.Kafka", str(paths.properties)]
    return spawn_logged(command, paths.log_file, paths.root)


def _new_state(paths: BrokerPaths, pid: int, ports: BrokerPorts) -> dict[str, Any]:
    return {
        "pid": pid,
        "port": ports.port,
        "controller_port": ports.controller_port,
        "bootstrap_servers": ports.bootstrap_servers,
        "log_file": str(paths.log_file),
        "started_at": now(),
    }


def _abort(paths: BrokerPaths, pid: int) -> None:
    """Stop a broker that did not become healthy, and forget it."""
    terminate(pid, 10.0)
    paths.state.unlink(missing_ok=True)


def _log_sizes(paths: BrokerPaths) -> dict[Path, int]:
    """The current size of both logs, to report only what a start adds to them."""
    logs = (paths.log_file, paths.server_log)
    return {path: path.stat().st_size if path.exists() else 0 for path in logs}


def _tail_report(paths: BrokerPaths, offsets: dict[Path, int]) -> str:
    """The end of what this start wrote to broker.out (stdout/stderr, WARN+) and server.log."""
    report = []
    for path, offset in offsets.items():
        size = path.stat().st_size if path.exists() else 0
        tail = log_tail(path, offset=offset if size >= offset else 0) or "(nothing new)"
        report.append(f"--- last {LOG_TAIL_LINES} lines of {path}:\n{tail}")
    return "\n".join(report)


# --------------------------------------------------------------------------- stop / status


def stop_broker(settings: Settings, timeout: float = 30.0) -> bool:
    """Stop the local broker; True if one was running, False if there was nothing to stop."""
    paths = BrokerPaths.of(settings)
    with _locked(paths):
        state = read_state(paths)
        if state is None:
            return False
        live = state_is_live(state, paths)
        if live:
            _stop_process(state["pid"], state.get("bootstrap_servers"), timeout)
        else:
            say(f"removing stale {paths.state} (process {state.get('pid')} is gone)")
        paths.state.unlink(missing_ok=True)
        recorded = read_recorded(paths.ports)
        if recorded is not None:
            say(f"its next start listens on {recorded.bootstrap_servers} again ({paths.ports})")
        return live


def _stop_process(pid: int, bootstrap: str | None, timeout: float) -> None:
    started = time.monotonic()
    clean = terminate(pid, timeout)
    seconds = time.monotonic() - started
    how = "shut down cleanly" if clean else f"killed after {timeout:.0f} s without exiting"
    say(f"broker pid {pid} at {bootstrap} {how} ({seconds:.1f} s)")


def broker_status(settings: Settings, timeout: float = 5.0) -> dict[str, Any]:
    """The broker state plus ``running``, ``healthy`` and, for a dead pid, ``stale``; when none
    runs, ``next_bootstrap_servers``: where its next start listens (if its ports are recorded)."""
    paths = BrokerPaths.of(settings)
    state = read_state(paths)
    if state is not None and state_is_live(state, paths):
        return {**state, "running": True, "healthy": probe(state["bootstrap_servers"], timeout)}
    status: dict[str, Any] = {"state_file": str(paths.state)} if state is None else {**state}
    status.update(running=False, healthy=False, ports_file=str(paths.ports))
    if state is not None:
        status["stale"] = True
    recorded = read_recorded(paths.ports)
    if recorded is not None:
        status["next_bootstrap_servers"] = recorded.bootstrap_servers
    return status


def wait_for_broker(settings: Settings, timeout: float = 60.0) -> float:
    """Block until the local broker (possibly still being started) is healthy.

    Returns the seconds waited; raises :class:`TimeoutError`, or :class:`BrokerError` at once
    if ``broker.json`` names a process that is gone.
    """
    start = time.monotonic()
    while True:
        remaining = start + timeout - time.monotonic()
        status = broker_status(settings, timeout=max(min(remaining, PROBE_SECONDS), 0.1))
        if status["healthy"]:
            return time.monotonic() - start
        if status.get("stale"):
            raise BrokerError(f"broker.json is stale: process {status.get('pid')} is gone")
        if remaining <= 0:
            raise TimeoutError(f"the local broker was not healthy within {timeout:.0f} s")
        time.sleep(0.5)


# --------------------------------------------------------------------------- command line


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``start | stop | status | wait`` command line."""
    parser = argparse.ArgumentParser(
        prog="broker.py", description="Manage the local single-node Kafka broker (KRaft)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start the broker (no-op if already healthy)")
    start.add_argument("--port", type=_port, help="client port (default: a free port)")
    start.add_argument("--controller-port", type=_port, help="controller port (default: free)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to become healthy")
    stop = commands.add_parser("stop", help="stop the broker (controlled shutdown)")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    status = commands.add_parser("status", help="print the state; exit 0 only if healthy")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds for the probe")
    wait = commands.add_parser("wait", help="block until the broker is healthy")
    wait.add_argument("--timeout", type=float, default=60.0, help="seconds to wait")
    return parser


def _cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    state = start_broker(settings, args.port, args.timeout, args.controller_port)
    print_json(state)
    if "ready_seconds" in state:
        say(f"broker ready at {state['bootstrap_servers']} in {state['ready_seconds']} s")
    return 0


def _cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    if not stop_broker(settings, args.timeout):
        say(f"no broker was running for {settings.broker_dir}")
    return 0


def _cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    status = broker_status(settings, args.timeout)
    print_json(status)
    if status.get("stale"):
        say(f"stale broker.json: process {status.get('pid')} is gone (run `broker.py start`)")
    elif not status["running"]:
        say(f"no broker is running for {settings.broker_dir}")
    if "next_bootstrap_servers" in status:
        say(
            f"its next start listens on {status['next_bootstrap_servers']} ({status['ports_file']})"
        )
    return 0 if status["healthy"] else 1


def _cmd_wait(settings: Settings, args: argparse.Namespace) -> int:
    try:
        seconds = wait_for_broker(settings, args.timeout)
    except TimeoutError as exc:
        say(str(exc))
        return 1
    say(f"broker healthy after {seconds:.1f} s")
    return 0


_COMMANDS: dict[str, Command] = {
    "start": _cmd_start,
    "stop": _cmd_stop,
    "status": _cmd_status,
    "wait": _cmd_wait,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    return run_cli(build_parser(), _COMMANDS, BrokerError, argv)


if __name__ == "__main__":
    sys.exit(main())

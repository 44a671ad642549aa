"""Local Kafka Connect worker (standalone mode) running Debezium's PostgreSQL connector.

Run it as a script (from any directory; it puts the project root on ``sys.path``)::

    .venv/bin/python platform/connect/worker.py start [--port N] [--schemas true|false] [--timeout 120]
    .venv/bin/python platform/connect/worker.py stop [--timeout 30]
    .venv/bin/python platform/connect/worker.py status
    .venv/bin/python platform/connect/worker.py create NAME --tables public.orders[,...] \\
        [--database D] [--topic-prefix P] [--slot S] [--publication P] [--snapshot-mode initial] \\
        [--decimal-handling-mode precise] [--time-precision-mode adaptive] [--schemas true|false] \\
        [--set key=value ...] [--timeout 120]
    .venv/bin/python platform/connect/worker.py list
    .venv/bin/python platform/connect/worker.py delete NAME

One JVM, ``org.apache.kafka.connect.cli.ConnectStandalone``, on the ``<jars>/connect`` jars
(Kafka Connect at the broker's Kafka version) with ``plugin.path`` = ``<jars>/connect-plugins``
(Debezium's PostgreSQL plugin, isolated in its own class loader), both fetched by ``make jars``.
It writes to the local broker (``Settings.resolved_bootstrap_servers``) and reads the project's
PostgreSQL (``platform/postgres/server.py``: its port, role and password; ``wal_level=logical``).

Everything lives under ``<runtime>/connect``: ``worker.properties``, ``offsets.dat`` (the file
offset store: where each connector has read to in the WAL), ``connectors.json`` (the connectors
created here: standalone Connect forgets them when it exits, so a restarted worker resubmits
them and they resume from their offsets), ``postgres.properties`` (mode 600: the password the
connectors read through Kafka's ``FileConfigProvider``, so no REST answer nor file of ours shows
it), the logs in ``logs/`` (``connect.out``: stdout and every WARN+ line; ``connect.log``: the
full INFO log) and ``worker.json``, the state of the running worker (pid, REST port and URL).

The slot rule: a logical replication slot pins WAL from its position on until it is dropped, so
``delete`` and ``stop`` drop the connector's slot and publication in PostgreSQL (``stop`` ends
every connector: the offsets go with their slots, and a connector created again starts with a
new snapshot). A worker that died (kill -9) keeps both: ``start`` resumes its connectors.

Machine-readable results (JSON) go to stdout, messages to stderr. Exit codes: 0 success,
1 worker or connector failure, 2 configuration problem (missing jars, broker or PostgreSQL down).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "postgres"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg2
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from connectors import (
    CONNECTOR_CLASS,
    ConnectError,
    ConnectorSpec,
    ConnectRest,
    create_connector,
    delete_connector,
    describe,
    pg_name,
    wait_running,
)
from local_service import (  # platform/services/local_service.py
    HOST,
    LOG_TAIL_LINES,
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
    spawn_logged,
    terminate,
    write_json,
)
from server import DATABASE  # platform/postgres/server.py
from slots import SLOT_RELEASE_SECONDS, SlotError, drop_slot, pg_access
from worker_files import (
    MAIN_CLASS,
    WorkerError,
    WorkerPaths,
    live_state,
    read_registry,
    write_registry,
    write_secrets,
)

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, java_executable, require_jars
from pipelines.settings import Settings

LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
JVM_OPTIONS = ("-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true")
PLUGIN = "debezium-connector-postgres"
#: How often the worker records where its connectors have read to. A killed worker sends again
#: what it read since its last flush (at-least-once); shorter than Connect's 60 s default.
OFFSET_FLUSH_MS = 5000
#: Largest record the worker's producer sends: the local broker's ``message.max.bytes``.
MAX_REQUEST_BYTES = 8 * 1024 * 1024


# --------------------------------------------------------------------------- configuration


def render_properties(paths: WorkerPaths, port: int, bootstrap: str, schemas: bool) -> str:
    """``worker.properties`` of a standalone worker on 127.0.0.1:``port``.

    The converters are Kafka's ``JsonConverter`` with ``schemas.enable`` = ``schemas`` (true:
    Debezium's ``{"schema", "payload"}`` envelope). Connect's internal converters (offsets) are
    always JSON since Kafka 3.0, which removed their settings. ``plugin.discovery=service_load``:
    Kafka's and Debezium's jars list their plugins in ``META-INF/services``, so the worker does
    not scan every class of the plugin path at start (seconds on two cores). The file config
    provider lets connectors name their password (``${file:...}``) instead of holding it.
    """
    flag = str(schemas).lower()
    values = {
        "bootstrap.servers": bootstrap,
        "listeners": f"http://{HOST}:{port}",
        "rest.advertised.host.name": HOST,
        "rest.advertised.port": port,
        "plugin.path": paths.plugins,
        "plugin.discovery": "service_load",
        "offset.storage.file.filename": paths.offsets,
        "offset.flush.interval.ms": OFFSET_FLUSH_MS,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": flag,
        "value.converter.schemas.enable": flag,
        "producer.max.request.size": MAX_REQUEST_BYTES,
        "config.providers": "file",
        "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
    }
    header = "# Written by platform/connect/worker.py on every start: edits are overwritten.\n"
    return header + "".join(f"{key}={value}\n" for key, value in values.items())


# --------------------------------------------------------------------------- processes


def _check_broker(bootstrap: str) -> None:
    """Connect refuses to start without its Kafka cluster: say so before a JVM is spent."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        raise ConfigError(
            f"the Kafka broker at {bootstrap} does not answer ({exc}): start it with "
            "`make broker-start`, or pass --bootstrap-servers"
        ) from exc


def _check_runtime(paths: WorkerPaths) -> str:
    """Java, the worker's jars and the Debezium plugin; returns the ``java`` binary."""
    java = java_executable()
    check_java(java)
    require_jars(paths.jars, "Kafka Connect worker")
    if not any((paths.plugins / PLUGIN).glob("*.jar")):
        raise ConfigError(
            f"Debezium's PostgreSQL connector is not in {paths.plugins / PLUGIN}: run `make jars`"
        )
    return java


def start_worker(
    settings: Settings,
    port: int | None = None,
    timeout: float = 120.0,
    schemas: bool = True,
    bootstrap: str | None = None,
) -> dict[str, Any]:
    """Start the worker (and resume the connectors recorded in ``connectors.json``), or return
    the state of the healthy one already running."""
    paths = WorkerPaths.of(settings)
    with locked(paths.lock):
        running = live_state(paths)
        if running is not None:
            if not ConnectRest(running["rest_url"]).answers():
                raise WorkerError(
                    f"the worker (pid {running['pid']}) runs but {running['rest_url']} does not "
                    f"answer: see {running['log_file']}, or restart it (make connect-stop "
                    "connect-start)"
                )
            say(f"Connect worker already running (pid {running['pid']}) at {running['rest_url']}")
            if running.get("schemas_enable") != schemas:
                say(
                    f"warning: it runs with schemas.enable={running.get('schemas_enable')}: "
                    "restart it (make connect-stop connect-start) to change that"
                )
            return {**running, "already_running": True, "healthy": True}
        servers = bootstrap or settings.resolved_bootstrap_servers()
        if port is not None:
            ensure_port_free(port, "--port")
        java = _check_runtime(paths)
        _check_broker(servers)
        if read_registry(paths):
            pg_access(settings)  # connectors to resume need PostgreSQL: say so before the JVM
        state = _launch(paths, java, port or free_ports(1)[0], servers, schemas, timeout)
        state["connectors"] = _resume(settings, paths, state, timeout)
        return state


def _launch(
    paths: WorkerPaths, java: str, port: int, bootstrap: str, schemas: bool, timeout: float
) -> dict[str, Any]:
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.properties.write_text(render_properties(paths, port, bootstrap, schemas))
    offset = paths.log_file.stat().st_size if paths.log_file.exists() else 0
    command = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
    command += [f"-Dconnect.logs.dir={paths.logs}", "-cp", str(paths.jars / "*")]
    command += [MAIN_CLASS, str(paths.properties)]
    started = time.monotonic()
    process = spawn_logged(command, paths.log_file, paths.root)
    rest = ConnectRest(f"http://{HOST}:{port}")
    state: dict[str, Any] = {
        "pid": process.pid,
        "port": port,
        "rest_url": rest.url,
        "bootstrap_servers": bootstrap,
        "schemas_enable": schemas,
        "plugin_path": str(paths.plugins),
        "offsets_file": str(paths.offsets),
        "log_file": str(paths.log_file),
        "started_at": now(),
    }
    write_json(paths.state, state)
    try:
        _wait_ready(rest, timeout, lambda: process.poll() is None)
    except WorkerError as exc:
        terminate(process.pid, 10.0)
        paths.state.unlink(missing_ok=True)
        tail = log_tail(paths.log_file, offset=offset) or "(nothing new)"
        raise WorkerError(
            f"{exc}\n--- last {LOG_TAIL_LINES} lines of {paths.log_file}:\n{tail}"
        ) from exc
    return {**state, "healthy": True, "ready_seconds": round(time.monotonic() - started, 2)}


def _wait_ready(rest: ConnectRest, timeout: float, alive: Any) -> None:
    """Until the REST API answers and lists Debezium's connector (its plugins are loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise WorkerError("the Connect worker exited during its start")
        try:
            plugins = rest.call("GET", "/connector-plugins?connectorsOnly=true")
        except ConnectError:
            time.sleep(0.5)
            continue
        classes = [plugin.get("class") for plugin in plugins]
        if CONNECTOR_CLASS in classes:
            return
        raise WorkerError(
            f"the worker started without Debezium's PostgreSQL connector (it has {classes}): "
            "run `make jars`, which unpacks it into the plugin path"
        )
    raise WorkerError(f"the Connect worker's REST API did not answer within {timeout:.0f} s")


def _resume(
    settings: Settings, paths: WorkerPaths, state: dict[str, Any], timeout: float
) -> list[str]:
    """Submit again the connectors of a worker that died: each resumes from its offsets."""
    registry = read_registry(paths)
    if not registry:
        return []
    pg = pg_access(settings)
    reference = write_secrets(paths, pg)
    rest = ConnectRest(state["rest_url"])
    for name, record in registry.items():
        spec = ConnectorSpec.from_record(record)
        say(f"resuming connector {name} from {paths.offsets} (slot {spec.slot})")
        rest.call("PUT", f"/connectors/{name}/config", spec.config(pg.port, pg.user, reference))
    for name in registry:
        wait_running(rest, name, timeout, paths.log_file)
    return sorted(registry)


# --------------------------------------------------------------------------- stop / status


def stop_worker(settings: Settings, timeout: float = 30.0) -> dict[str, Any]:
    """Stop the worker and end every connector: drop its slot and publication, then the offsets.

    A slot that cannot be dropped (PostgreSQL down) keeps its connector in ``connectors.json``
    and the offsets file, so the next ``start`` resumes it or the next ``stop`` drops it."""
    paths = WorkerPaths.of(settings)
    with locked(paths.lock):
        state = live_state(paths)
        if state is not None:
            clean = terminate(state["pid"], timeout)
            how = "shut down cleanly" if clean else f"killed after {timeout:.0f} s"
            say(f"Connect worker pid {state['pid']} at {state['rest_url']} {how}")
        paths.state.unlink(missing_ok=True)
        registry = read_registry(paths)
        dropped, kept = _drop_slots(settings, registry)
        write_registry(paths, {name: registry[name] for name in kept})
        if not kept:
            paths.offsets.unlink(missing_ok=True)
        return {"was_running": state is not None, "dropped": dropped, "kept": kept}


def _drop_slots(
    settings: Settings, registry: dict[str, dict[str, Any]]
) -> tuple[dict[str, list[str]], list[str]]:
    dropped: dict[str, list[str]] = {}
    kept: list[str] = []
    for name, record in registry.items():
        spec = ConnectorSpec.from_record(record)
        try:
            pg = pg_access(settings)
            dropped[name] = drop_slot(
                pg, spec.database, spec.slot, spec.publication, SLOT_RELEASE_SECONDS
            )
        except (ConfigError, SlotError, psycopg2.Error) as exc:
            kept.append(name)
            say(
                f"warning: could not drop slot {spec.slot} of connector {name} ({exc}); it pins "
                "PostgreSQL's WAL until dropped: start PostgreSQL (make postgres-start) and run "
                "`make connect-stop` again"
            )
            continue
        what = " and ".join(dropped[name]) or "nothing (already gone)"
        say(f"connector {name} ended: dropped {what} in database {spec.database}")
    return dropped, kept


def worker_status(settings: Settings) -> dict[str, Any]:
    """The worker's state, whether its REST API answers, and its connectors."""
    paths = WorkerPaths.of(settings)
    state = read_json(paths.state)
    registry = read_registry(paths)
    live = live_state(paths) if state is not None else None
    if live is None:
        status: dict[str, Any] = {"state_file": str(paths.state), "running": False}
        return {**status, "healthy": False, "connectors": describe(None, registry)}
    rest = ConnectRest(live["rest_url"])
    healthy = rest.answers()
    listing = describe(rest if healthy else None, registry)
    return {**live, "running": True, "healthy": healthy, "connectors": listing}


# --------------------------------------------------------------------------- command line


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: give true or false")
    return text.lower() == "true"


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give a Debezium setting as key=value")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    """The ``start | stop | status | create | list | delete`` command line."""
    parser = argparse.ArgumentParser(
        prog="worker.py", description="Manage the local Kafka Connect worker and its connectors."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start the worker (no-op if already healthy)")
    start.add_argument("--port", type=_port, help="REST port (default: a free port)")
    start.add_argument("--bootstrap-servers", help="Kafka (default: the local broker's)")
    start.add_argument("--schemas", type=_flag, default=True, help="JsonConverter schemas.enable")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to become ready")
    stop = commands.add_parser("stop", help="stop the worker; drop every connector's slot")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    commands.add_parser("status", help="print the state; exit 0 only if healthy")
    commands.add_parser("list", help="list the connectors and their tasks' states")
    delete = commands.add_parser("delete", help="delete a connector; drop its slot")
    delete.add_argument("name")
    _add_create(commands.add_parser("create", help="create a Debezium PostgreSQL connector"))
    return parser


def _add_create(create: argparse.ArgumentParser) -> None:
    create.add_argument("name", help="the connector's name")
    create.add_argument("--tables", required=True, help="schema.table[,schema.table...]")
    create.add_argument("--database", default=DATABASE, help=f"default: {DATABASE}")
    create.add_argument("--topic-prefix", help="topics <prefix>.<schema>.<table> (default: name)")
    create.add_argument("--slot", help="replication slot (default: conflux_<name>)")
    create.add_argument("--publication", help="publication (default: conflux_<name>)")
    create.add_argument("--snapshot-mode", default="initial")
    create.add_argument("--decimal-handling-mode", default="precise")
    create.add_argument("--time-precision-mode", default="adaptive")
    create.add_argument("--schemas", type=_flag, help="schemas.enable (default: the worker's)")
    create.add_argument(
        "--set", type=_setting, action="append", default=[], metavar="KEY=VALUE",
        help="any other Debezium setting (repeatable)",
    )  # fmt: skip
    create.add_argument("--timeout", type=float, default=120.0, help="seconds to be RUNNING")


def spec_of(args: argparse.Namespace) -> ConnectorSpec:
    """The connector ``create``'s arguments describe."""
    return ConnectorSpec(
        name=args.name,
        database=args.database,
        tables=tuple(t.strip() for t in args.tables.split(",") if t.strip()),
        topic_prefix=args.topic_prefix or args.name,
        slot=args.slot or pg_name(args.name),
        publication=args.publication or pg_name(args.name),
        snapshot_mode=args.snapshot_mode,
        decimal_handling_mode=args.decimal_handling_mode,
        time_precision_mode=args.time_precision_mode,
        schemas=args.schemas,
        extra=dict(args.set),
    )


def _cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    state = start_worker(settings, args.port, args.timeout, args.schemas, args.bootstrap_servers)
    print_json(state)
    if "ready_seconds" in state:
        say(
            f"Connect worker ready at {state['rest_url']} in {state['ready_seconds']} s "
            f"(Kafka {state['bootstrap_servers']}, plugins {state['plugin_path']})"
        )
    return 0


def _cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    result = stop_worker(settings, args.timeout)
    print_json(result)
    if not result["was_running"] and not result["dropped"]:
        say(f"no Connect worker was running for {WorkerPaths.of(settings).root}")
    return 0  # a slot left in place is a warning above: the worker itself is stopped


def _cmd_status(settings: Settings, _args: argparse.Namespace) -> int:
    status = worker_status(settings)
    print_json(status)
    if not status["running"]:
        say(f"no Connect worker is running for {WorkerPaths.of(settings).root}")
    return 0 if status["healthy"] else 1


def _cmd_create(settings: Settings, args: argparse.Namespace) -> int:
    print_json(create_connector(settings, spec_of(args), args.timeout))
    return 0


def _cmd_list(settings: Settings, _args: argparse.Namespace) -> int:
    state = live_state(WorkerPaths.of(settings))
    rest = None if state is None else ConnectRest(state["rest_url"])
    print_json({"connectors": describe(rest, read_registry(WorkerPaths.of(settings)))})
    return 0


def _cmd_delete(settings: Settings, args: argparse.Namespace) -> int:
    print_json({"deleted": args.name, "dropped": delete_connector(settings, args.name)})
    return 0


_COMMANDS: dict[str, Command] = {
    "start": _cmd_start,
    "stop": _cmd_stop,
    "status": _cmd_status,
    "create": _cmd_create,
    "list": _cmd_list,
    "delete": _cmd_delete,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    try:
        return run_cli(build_parser(), _COMMANDS, WorkerError, argv)
    except (ConnectError, SlotError, psycopg2.Error) as exc:
        say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

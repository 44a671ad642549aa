"""Pure logic of platform/kafka/broker.py that needs no JVM and no running broker."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipelines.errors import ConfigError
from pipelines.settings import PROJECT_ROOT, Settings


def _load_broker_module() -> ModuleType:
    """Import the script by path: ``platform/`` is deliberately not a package."""
    path = PROJECT_ROOT / "platform" / "kafka" / "broker.py"
    spec = importlib.util.spec_from_file_location("conflux_kafka_broker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


broker = _load_broker_module()
broker_ports = sys.modules["broker_ports"]  # imported by broker.py from its own folder


def _settings(tmp_path: Path) -> Settings:
    return Settings(runtime_dir=tmp_path, jars_dir=tmp_path / "jars")


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


def test_properties_describe_a_combined_single_node(tmp_path: Path) -> None:
    props = _properties(broker.render_properties(9092, 9093, tmp_path / "data"))

    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["message.max.bytes"] == props["replica.fetch.max.bytes"] == str(8 * 1024 * 1024)


def test_cluster_id_is_a_kafka_uuid() -> None:
    cluster_id = broker.new_cluster_id()

    assert len(cluster_id) == 22 and not cluster_id.startswith("-")
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_meta_properties_cluster_id(tmp_path: Path) -> None:
    assert broker.read_meta_cluster_id(tmp_path) is None
    (tmp_path / "meta.properties").write_text("#\nnode.id=1\ncluster.id=abc\nversion=1\n")

    assert broker.read_meta_cluster_id(tmp_path) == "abc"


def test_select_ports_picks_distinct_free_ports() -> None:
    ports = broker.select_ports(None, None)

    assert ports.port != ports.controller_port
    for value in (ports.port, ports.controller_port):
        assert broker_ports._bindable(value)


def test_first_ports_are_picked_below_the_ephemeral_range() -> None:
    """Kept across restarts, they must not be handed to an outgoing connection meanwhile."""
    floor = broker_ports._ephemeral_floor()
    if floor is None or floor - broker_ports.PICK_FLOOR < broker_ports.MIN_PICK_RANGE:
        pytest.skip("no room below this machine's ephemeral port range")

    ports = broker.select_ports(None, None, Path("/nonexistent/ports.json"))

    assert min(ports.port, ports.controller_port) >= broker_ports.PICK_FLOOR
    assert max(ports.port, ports.controller_port) < floor


# --------------------------------------------------------------------------- recorded ports


def _record(tmp_path: Path, port: int, controller_port: int) -> Path:
    """``ports.json`` as the broker's first start writes it."""
    paths = broker.BrokerPaths.of(_settings(tmp_path))
    paths.root.mkdir(parents=True, exist_ok=True)
    broker.record_ports(paths.ports, broker.BrokerPorts(port, controller_port))
    return paths.ports


def test_later_starts_select_the_recorded_ports(tmp_path: Path) -> None:
    recorded = broker_ports.pick_ports(3)
    ports_file = _record(tmp_path, recorded[0], recorded[1])

    assert broker.select_ports(None, None, ports_file) == broker.BrokerPorts(*recorded[:2])
    # --port moves the client port only; the controller keeps its recorded one.
    moved = broker.select_ports(recorded[2], None, ports_file)
    assert moved == broker.BrokerPorts(recorded[2], recorded[1])


@pytest.mark.parametrize("taken", ["port", "controller_port"])
def test_a_start_refuses_when_a_recorded_port_is_taken(tmp_path: Path, taken: str) -> None:
    """Through start_broker itself: the ports are checked before Java and the jars (there are
    none in this runtime), so the refusal is immediate and nothing else is touched."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held, other = holder.getsockname()[1], broker_ports.pick_ports(1)[0]
        pair = (held, other) if taken == "port" else (other, held)
        ports_file = _record(tmp_path, *pair)
        with pytest.raises(ConfigError) as refused:
            broker.start_broker(_settings(tmp_path))

    message = str(refused.value)
    role = "client" if taken == "port" else "controller"
    assert f"port {held} on 127.0.0.1, the broker's {role} port recorded in {ports_file}" in message
    if shutil.which("ss"):  # the holder is named: this very process
        assert f"held by pid {os.getpid()} (" in message
    else:
        assert f"ss -ltnp 'sport = :{held}'" in message
    assert f"free port {held}" in message and f"delete {ports_file}" in message
    assert not (tmp_path / "kafka" / "broker.json").exists()
    assert json.loads(ports_file.read_text())["port"] == pair[0]  # the record is kept


def test_a_damaged_ports_file_names_the_field_and_the_fix(tmp_path: Path) -> None:
    ports_file = _record(tmp_path, 1, 2)
    ports_file.write_text(json.dumps({"port": "9092", "controller_port": 9093}))

    with pytest.raises(ConfigError, match=r"ports\.json is damaged: `port` is '9092'.*delete"):
        broker.select_ports(None, None, ports_file)


def test_status_of_a_stopped_broker_says_where_it_comes_back(tmp_path: Path) -> None:
    _record(tmp_path, 30123, 30124)

    status = broker.broker_status(_settings(tmp_path))

    assert status["running"] is False
    assert status["next_bootstrap_servers"] == "127.0.0.1:30123"


def test_taken_port_is_named_in_the_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} .*--port"):
            broker.select_ports(port, None)


def test_same_port_twice_is_rejected() -> None:
    with pytest.raises(ConfigError, match="must differ"):
        broker.select_ports(40000, 40000)


def test_status_without_state(tmp_path: Path) -> None:
    status = broker.broker_status(_settings(tmp_path))

    assert status["running"] is False and status["healthy"] is False
    assert "stale" not in status


def test_stale_state_with_dead_pid(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.broker_dir.mkdir()
    state = {"pid": _dead_pid(), "bootstrap_servers": "127.0.0.1:1"}
    (settings.broker_dir / "broker.json").write_text(json.dumps(state))

    assert broker.broker_status(settings)["stale"] is True
    assert broker.stop_broker(settings) is False
    assert not (settings.broker_dir / "broker.json").exists()


def test_a_live_pid_that_is_not_kafka_is_not_our_broker(tmp_path: Path) -> None:
    paths = broker.BrokerPaths.of(_settings(tmp_path))

    assert broker.pid_alive(os.getpid())
    assert not broker.is_our_broker(os.getpid(), paths)


def test_stop_with_nothing_running(tmp_path: Path) -> None:
    assert broker.stop_broker(_settings(tmp_path)) is False


def test_log_tail_from_offset(tmp_path: Path) -> None:
    log = tmp_path / "broker.out"
    log.write_text("old\n" + "".join(f"line {i}\n" for i in range(40)))

    assert broker.log_tail(log, lines=2) == "line 38\nline 39"
    assert broker.log_tail(log, lines=50, offset=4).splitlines()[0] == "line 0"
    assert broker.log_tail(tmp_path / "missing") == ""


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_service_stops_on_sigterm_even_if_its_manager_ignores_it(tmp_path: Path) -> None:
    """A manager started where SIGTERM is ignored (a script's background job under Dagster):
    the service it starts still has SIGTERM at its default, so ``terminate`` ends it by SIGTERM
    alone instead of waiting out its timeout for the SIGKILL (a JVM started with SIGTERM ignored
    never installs its shutdown handler)."""
    local_service = sys.modules["local_service"]
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        process = local_service.spawn_logged(["sleep", "60"], tmp_path / "service.log", tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    ignored = Path(f"/proc/{process.pid}/status").read_text().split("SigIgn:")[1].split()[0]
    assert not int(ignored, 16) & (1 << (signal.SIGTERM - 1)), ignored
    assert local_service.terminate(process.pid, 5.0) is True
    process.poll()  # terminate reaped it: Popen learns there is no child left

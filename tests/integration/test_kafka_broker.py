"""The local Kafka broker manager (platform/kafka/broker.py) against a real broker, no mocks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

if TYPE_CHECKING:
    from conftest import KafkaBroker, ServiceCli

pytestmark = pytest.mark.timeout(300)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create ``name`` and wait until the broker confirms it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
    futures[name].result(timeout=30)


def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> None:
    """Produce ``records`` as (key, value) and wait until all are acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0, "messages left unacknowledged"
    assert not failures, failures


def consume(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[tuple]:
    """Read ``topic`` from the start with a fresh group: (key, value, partition) tuples."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while len(received) < expected and time.monotonic() < deadline:
            received += _batch(consumer)
        received += _batch(consumer, wait=1.0)  # anything beyond `expected` is a duplicate
    finally:
        consumer.close()
    return received


def _batch(consumer: Consumer, wait: float = 1.0) -> list[tuple]:
    messages = consumer.consume(num_messages=500, timeout=wait)
    errors = [m.error() for m in messages if m.error() is not None]
    assert not errors, errors
    return [(m.key().decode(), m.value().decode(), m.partition()) for m in messages]


def taken_port() -> socket.socket:
    """A socket bound (and listening) on a free 127.0.0.1 port; the caller closes it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


# --------------------------------------------------------------------------- (a) round trip


def test_produce_consume_round_trip(kafka_broker: KafkaBroker) -> None:
    topic = f"round-trip-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=3)
    records = [(f"key-{i % 37}", f"value-{i}") for i in range(1000)]

    produce(kafka_broker.bootstrap_servers, topic, records)
    received = consume(kafka_broker.bootstrap_servers, topic, expected=len(records))

    assert Counter((key, value) for key, value, _ in received) == Counter(records)
    partitions_of_key: dict[str, set[int]] = {}
    for key, _, partition in received:
        partitions_of_key.setdefault(key, set()).add(partition)
    assert {p for parts in partitions_of_key.values() for p in parts} == {0, 1, 2}
    assert all(len(parts) == 1 for parts in partitions_of_key.values()), "a key spans partitions"


# --------------------------------------------------------------------------- (b), (c) CLI


def test_status_reports_healthy(kafka_broker: KafkaBroker, broker_cli: ServiceCli) -> None:
    result = broker_cli.run("status", runtime_dir=kafka_broker.runtime_dir)

    assert result.returncode == 0, broker_cli.describe(result)
    status = broker_cli.parse(result)
    assert status["healthy"] is True and status["running"] is True
    assert status["pid"] == kafka_broker.pid
    assert status["bootstrap_servers"] == kafka_broker.bootstrap_servers


def test_wait_returns_at_once_when_healthy(
    kafka_broker: KafkaBroker, broker_cli: ServiceCli
) -> None:
    result = broker_cli.run("wait", "--timeout", "30", runtime_dir=kafka_broker.runtime_dir)

    assert result.returncode == 0, broker_cli.describe(result)


def test_start_again_is_idempotent(kafka_broker: KafkaBroker, broker_cli: ServiceCli) -> None:
    result = broker_cli.run("start", runtime_dir=kafka_broker.runtime_dir)

    assert result.returncode == 0, broker_cli.describe(result)
    state = broker_cli.parse(result)
    assert state["pid"] == kafka_broker.pid
    assert state["bootstrap_servers"] == kafka_broker.bootstrap_servers
    assert state["already_running"] is True


# --------------------------------------------------------------------------- (d) port taken


def test_start_on_taken_port_fails_fast(broker_cli: ServiceCli, tmp_path: Path) -> None:
    with taken_port() as sock:
        port = sock.getsockname()[1]
        started = time.monotonic()
        result = broker_cli.run("start", "--port", str(port), runtime_dir=tmp_path)
        elapsed = time.monotonic() - started

    assert result.returncode == 2, broker_cli.describe(result)
    assert f"port {port}" in result.stderr and "--port" in result.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s: the port must be checked before launching"
    assert not (tmp_path / "kafka" / "broker.json").exists()
    assert not (tmp_path / "kafka" / "data" / "meta.properties").exists(), "storage formatted"


# --------------------------------------------------------------------------- (e) restart


def test_restart_keeps_its_port_topics_and_messages(broker_cli: ServiceCli, tmp_path: Path) -> None:
    """A client given the broker's address finds it there again after stop / start: the ports of
    the first start are recorded in ``ports.json`` and reused; a start refuses at once if one of
    them is taken meanwhile (``--port`` moving it on purpose: the unit tests)."""
    topic = "survives-restart"
    records = [(f"k{i}", f"v{i}") for i in range(20)]
    ports_file = tmp_path / "kafka" / "ports.json"
    try:
        first = broker_cli.parse(broker_cli.run("start", runtime_dir=tmp_path))
        assert first["formatted_storage"] is True
        bootstrap = first["bootstrap_servers"]
        create_topic(bootstrap, topic, partitions=1)
        produce(bootstrap, topic, records)

        stopped = broker_cli.run("stop", runtime_dir=tmp_path)
        assert stopped.returncode == 0, broker_cli.describe(stopped)
        assert f"its next start listens on {bootstrap} again" in stopped.stderr
        assert not (tmp_path / "kafka" / "broker.json").exists()

        with socket.socket() as squatter:  # the recorded port, taken while the broker is down
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
            squatter.bind(("127.0.0.1", first["port"]))
            squatter.listen()
            refused = broker_cli.run("start", runtime_dir=tmp_path)
        assert refused.returncode == 2, broker_cli.describe(refused)
        assert f"port {first['port']} on 127.0.0.1, the broker's client port" in refused.stderr
        assert f"delete {ports_file}" in refused.stderr
        assert not (tmp_path / "kafka" / "broker.json").exists()

        again = broker_cli.run("start", runtime_dir=tmp_path)  # as `make broker-start` does
        assert again.returncode == 0, broker_cli.describe(again)
        second = broker_cli.parse(again)
        assert second["formatted_storage"] is False
        assert second["bootstrap_servers"] == bootstrap
        assert second["controller_port"] == first["controller_port"]
        assert f"broker ready at {bootstrap}" in again.stderr
        received = consume(bootstrap, topic, expected=len(records))
        assert sorted((key, value) for key, value, _ in received) == sorted(records)

    finally:
        final = broker_cli.run("stop", runtime_dir=tmp_path)
        assert final.returncode == 0, broker_cli.describe(final)


# --------------------------------------------------------------------------- (f) and others


def test_missing_jars_asks_for_make_setup(broker_cli: ServiceCli, tmp_path: Path) -> None:
    empty_jars = tmp_path / "jars"
    empty_jars.mkdir()

    result = broker_cli.run("start", runtime_dir=tmp_path / "rt", jars_dir=empty_jars)

    assert result.returncode == 2, broker_cli.describe(result)
    assert "make setup" in result.stderr


def test_stale_state_is_detected_and_cleared(broker_cli: ServiceCli, tmp_path: Path) -> None:
    state_file = tmp_path / "kafka" / "broker.json"
    state_file.parent.mkdir(parents=True)
    state_file.write_text(json.dumps({"pid": dead_pid(), "bootstrap_servers": "127.0.0.1:1"}))

    status = broker_cli.run("status", runtime_dir=tmp_path)
    assert status.returncode == 1, broker_cli.describe(status)
    assert broker_cli.parse(status)["stale"] is True and "stale" in status.stderr

    stop = broker_cli.run("stop", runtime_dir=tmp_path)
    assert stop.returncode == 0, broker_cli.describe(stop)
    assert not state_file.exists()


def test_stop_and_wait_without_broker(broker_cli: ServiceCli, tmp_path: Path) -> None:
    stop = broker_cli.run("stop", runtime_dir=tmp_path)
    assert stop.returncode == 0, broker_cli.describe(stop)
    assert "no broker was running" in stop.stderr

    wait = broker_cli.run("wait", "--timeout", "1", runtime_dir=tmp_path)
    assert wait.returncode == 1, broker_cli.describe(wait)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid

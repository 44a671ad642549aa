"""Debezium's PostgreSQL connector on the project's own Connect worker, against the project's own
PostgreSQL (``platform/connect/worker.py``, ``platform/postgres/server.py``), at small scale.

ONE PostgreSQL, ONE worker and ONE connector for the module, writing to the session's broker;
one Conflux flow on the session's Spark reads what it wrote. A table with the column types Conflux's CDC path must parse (``numeric(12,2)``,
``timestamptz``, ``jsonb``, ``uuid``, ``text[]``) is snapshotted, then changed by one
multi-statement transaction: the topic holds what the real connector emits (``r`` rows, then
``c``, ``u``, ``d`` and the delete's tombstone, each ``{"schema", "payload"}`` with the change's
LSN and transaction id). Deleting the connector drops its replication slot and publication:
a slot nobody reads pins PostgreSQL's WAL.

PostgreSQL runs as Debian's ``postgres`` user when the suite runs as root (as CI does), so its
runtime folder is outside pytest's temporary folders, which are private to root.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyspark.sql import SparkSession

from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import PROJECT_ROOT, Settings
from pipelines.spec import load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.delta_read import read_rows
from tests.support.runtime import KafkaBroker, ServiceCli
from tests.support.tables import silver_path

pytestmark = pytest.mark.timeout(600)

POSTGRES_SCRIPT = PROJECT_ROOT / "platform" / "postgres" / "server.py"
WORKER_SCRIPT = PROJECT_ROOT / "platform" / "connect" / "worker.py"
DATABASE = "cdc_source"
CONNECTOR = "accounts"
SLOT = "conflux_accounts"
TOPIC = "cdctest.public.accounts"
REF = {1: uuid.UUID(int=1), 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}
TABLE = """
CREATE TABLE public.accounts (
    id integer PRIMARY KEY,
    balance numeric(12, 2) NOT NULL,
    opened_at timestamptz NOT NULL,
    profile jsonb,
    ref uuid NOT NULL,
    tags text[]
)"""
ROW = "INSERT INTO public.accounts VALUES (%s, %s, %s, %s, %s, %s)"


@dataclass(frozen=True)
class Source:
    """The module's PostgreSQL and Connect worker, and how to reach them."""

    runtime: Path
    worker: ServiceCli
    port: int
    password: str
    bootstrap_servers: str

    @contextmanager
    def transaction(self, database: str = DATABASE) -> Iterator[Any]:
        """A cursor whose statements commit together when the block ends."""
        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="conflux", password=self.password,
            dbname=database,
        )  # fmt: skip
        try:
            with conn, conn.cursor() as cursor:
                yield cursor
        finally:
            conn.close()

    def count(self, sql: str, *args: Any) -> int:
        with self.transaction() as cursor:
            cursor.execute(sql, args)
            return int(cursor.fetchone()[0])


def _prepare_database(source: Source) -> None:
    """The source database and its table, with two rows for the snapshot."""
    admin = psycopg2.connect(
        host="127.0.0.1", port=source.port, user="conflux", password=source.password,
        dbname="postgres",
    )  # fmt: skip
    admin.autocommit = True  # CREATE DATABASE runs outside a transaction
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {DATABASE}")
    admin.close()
    with source.transaction() as cursor:
        cursor.execute(TABLE)
        cursor.execute(
            ROW, (1, "10.50", "2026-11-20 10:00:00+00", '{"tier": "gold"}', str(REF[1]), ["a", "b"])
        )
        cursor.execute(ROW, (2, "-3.25", "2026-11-20 11:30:00+01", None, str(REF[2]), []))


@pytest.fixture(scope="module")
def source(kafka_jars_dir: Path, kafka_broker: KafkaBroker) -> Iterator[Source]:
    runtime = Path(tempfile.mkdtemp(prefix="conflux-cdc-"))
    os.chmod(runtime, 0o711)
    postgres = ServiceCli(kafka_jars_dir, POSTGRES_SCRIPT)
    worker = ServiceCli(kafka_jars_dir, WORKER_SCRIPT)
    try:
        started = postgres.run("start", runtime_dir=runtime)
        if started.returncode != 0:
            pytest.fail(f"PostgreSQL did not start:\n{postgres.describe(started)}")
        assert postgres.parse(started)["replication"]["wal_level"] == "logical"
        saved = json.loads((runtime / "postgres" / "credentials.json").read_text())
        bootstrap = kafka_broker.bootstrap_servers
        found = Source(runtime, worker, saved["port"], saved["password"], bootstrap)
        _prepare_database(found)
        started = worker.run("start", "--bootstrap-servers", bootstrap, runtime_dir=runtime)
        if started.returncode != 0:
            pytest.fail(f"the Connect worker did not start:\n{worker.describe(started)}")
        yield found
    finally:
        stopped = worker.run("stop", runtime_dir=runtime, timeout=120)
        down = postgres.run("stop", runtime_dir=runtime)
        shutil.rmtree(runtime, ignore_errors=True)
        assert stopped.returncode == 0, worker.describe(stopped)
        assert down.returncode == 0, postgres.describe(down)


@pytest.fixture(scope="module")
def connector(source: Source) -> dict[str, Any]:
    """The module's connector, RUNNING (its snapshot may still be under way)."""
    created = source.worker.run(
        "create", CONNECTOR, "--database", DATABASE, "--tables", "public.accounts",
        "--topic-prefix", "cdctest", runtime_dir=source.runtime,
    )  # fmt: skip
    assert created.returncode == 0, source.worker.describe(created)
    return source.worker.parse(created)


def read_topic(source: Source, count: int, timeout: float = 60.0) -> list[tuple[Any, Any]]:
    """The first ``count`` records of the connector's topic as (key, value) JSON (a tombstone's
    value is None); the topic appears with the snapshot's first row."""
    consumer = Consumer(
        {"bootstrap.servers": source.bootstrap_servers, "group.id": f"t-{uuid.uuid4().hex}",
         "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 500}
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while TOPIC not in consumer.list_topics(timeout=5).topics:
            assert time.monotonic() < deadline, f"{TOPIC} was never created"
            time.sleep(0.5)
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        records: list[tuple[Any, Any]] = []
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            value = message.value()
            records.append((json.loads(message.key() or b"null"), value and json.loads(value)))
    finally:
        consumer.close()
    assert len(records) == count, f"{len(records)} of {count} records in {timeout:.0f} s: {records}"
    return records


def column_schema(envelope: dict[str, Any], column: str) -> dict[str, Any]:
    """The Connect schema of ``column`` inside the envelope's ``after`` struct."""
    after = next(f for f in envelope["schema"]["fields"] if f["field"] == "after")
    return next(f for f in after["fields"] if f["field"] == column)


def decimal(value: str, scale: int) -> float:
    """``decimal.handling.mode=precise``: the unscaled value's big-endian two's complement."""
    return int.from_bytes(base64.b64decode(value), "big", signed=True) / 10**scale


def test_snapshot_then_a_transaction_arrive_as_debezium_envelopes(
    source: Source, connector: dict[str, Any]
) -> None:
    assert connector["status"]["tasks"][0]["state"] == "RUNNING"
    # The worker reads the password from a file: it is in no REST answer nor file of the manager.
    assert connector["config"]["database.password"].startswith("${file:")
    assert source.password not in json.dumps(connector)
    snapshot = read_topic(source, 2)
    with source.transaction() as cursor:  # one transaction, three statements
        cursor.execute(ROW, (3, "12.00", "2026-11-21 00:00:00+00", '{"n": 1}', str(REF[3]), ["z"]))
        cursor.execute("UPDATE public.accounts SET balance = 11.25, tags = '{a}' WHERE id = 1")
        cursor.execute("DELETE FROM public.accounts WHERE id = 2")
    records = read_topic(source, 6)  # the snapshot again, c, u, d and the delete's tombstone
    assert records[:2] == snapshot
    envelopes = [value for _, value in records[:5]]
    tombstone_key, tombstone = records[5]
    assert [e["payload"]["op"] for e in envelopes] == ["r", "r", "c", "u", "d"]
    assert all(set(e) == {"schema", "payload"} for e in envelopes)
    sources = [e["payload"]["source"] for e in envelopes]
    assert all(s["lsn"] is not None and s["txId"] is not None for s in sources)
    streamed = sources[2:]
    assert len({s["txId"] for s in streamed}) == 1, "one transaction, one txId"
    assert [s["lsn"] for s in streamed] == sorted(s["lsn"] for s in streamed)
    assert tombstone is None and tombstone_key["payload"] == {"id": 2}

    created, updated, deleted = (e["payload"] for e in envelopes[2:])
    balance = column_schema(envelopes[2], "balance")
    assert balance["name"] == "org.apache.kafka.connect.data.Decimal"
    assert balance["parameters"]["scale"] == "2"
    assert decimal(created["after"]["balance"], 2) == 12.00
    assert decimal(updated["after"]["balance"], 2) == 11.25
    assert column_schema(envelopes[2], "opened_at")["name"] == "io.debezium.time.ZonedTimestamp"
    # A ZonedTimestamp string, in UTC, padded to the column's precision (6 digits by default).
    assert created["after"]["opened_at"] == "2026-11-21T00:00:00.000000Z"
    assert column_schema(envelopes[2], "profile")["name"] == "io.debezium.data.Json"
    assert json.loads(created["after"]["profile"]) == {"n": 1}
    assert column_schema(envelopes[2], "ref")["name"] == "io.debezium.data.Uuid"
    assert created["after"]["ref"] == str(REF[3])
    assert column_schema(envelopes[2], "tags")["type"] == "array"
    assert updated["after"]["tags"] == ["a"]
    assert deleted["after"] is None and deleted["before"]["id"] == 2  # replica identity DEFAULT


def test_conflux_parses_the_real_changes_into_a_current_state_equal_to_the_table(
    source: Source,
    connector: dict[str, Any],
    spark: SparkSession,
    spark_settings: Settings,
    tmp_path: Path,
) -> None:
    """The records above through a Conflux flow (bronze, then silver's Debezium parser: precise
    decimals, ZonedTimestamps, jsonb, uuid, arrays, a key-only delete): its current-state table
    equals ``SELECT *`` of the table, value for value and type for type."""
    spec = load_spec(
        write_spec(
            tmp_path / "flows",
            {
                "name": "accounts",
                "source": {"kind": "kafka", "topics": [TOPIC], "starting_offsets": "earliest"},
                "target": {"table": "bronze_cdc_accounts"},
                "silver": {
                    "format": "debezium",
                    "schema": "id INT, balance DECIMAL(12,2), opened_at TIMESTAMP, "
                    "profile STRING, ref STRING, tags ARRAY<STRING>",
                    "events": {"table": "silver_cdc_account_events"},
                    "quarantine": {"table": "silver_cdc_accounts_quarantine"},
                    "current": {"table": "cdc_accounts", "keys": ["id"]},
                },
            },
        )
    )
    settings = replace(spark_settings, kafka_bootstrap_servers=source.bootstrap_servers)
    code = run_flows([spec], settings, Reporter(), StopRequest(None), "available_now", spark=spark)
    assert code == EXIT_OK
    assert read_rows(silver_path(settings, "silver_cdc_accounts_quarantine")) == []
    landed = sorted(read_rows(silver_path(settings, "cdc_accounts")), key=lambda r: r["id"])
    with source.transaction() as cursor:
        cursor.execute("SELECT id, balance, opened_at, profile, ref, tags FROM public.accounts")
        table = sorted(cursor.fetchall())
    assert [
        (
            r["id"],
            r["balance"],
            r["opened_at"],
            json.loads(r["profile"] or "null"),
            r["ref"],
            r["tags"],
        )
        for r in landed
    ] == [(i, b, o.astimezone(UTC), p, str(ref), tags) for i, b, o, p, ref, tags in table]
    assert all(isinstance(r["balance"], Decimal) for r in landed)


def test_list_shows_the_connector_its_task_and_its_slot(
    source: Source, connector: dict[str, Any]
) -> None:
    listed = source.worker.run("list", runtime_dir=source.runtime)
    assert listed.returncode == 0, source.worker.describe(listed)
    (entry,) = source.worker.parse(listed)["connectors"]
    assert entry["name"] == CONNECTOR and entry["state"] == "RUNNING"
    assert [task["state"] for task in entry["tasks"]] == ["RUNNING"]
    assert entry["slot"] == SLOT and entry["database"] == DATABASE
    assert source.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", SLOT) == 1


def test_deleting_the_connector_drops_its_slot_and_publication(
    source: Source, connector: dict[str, Any]
) -> None:
    deleted = source.worker.run("delete", CONNECTOR, runtime_dir=source.runtime)
    assert deleted.returncode == 0, source.worker.describe(deleted)
    assert "dropped replication slot conflux_accounts" in deleted.stderr
    assert source.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", SLOT) == 0
    assert source.count("SELECT count(*) FROM pg_publication WHERE pubname = %s", SLOT) == 0
    listed = source.worker.run("list", runtime_dir=source.runtime)
    assert source.worker.parse(listed)["connectors"] == []

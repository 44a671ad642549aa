"""Debezium's PostgreSQL connector on the project's own Connect worker, against the project's own
PostgreSQL (``platform/connect/worker.py``, ``platform/postgres/server.py``), at small scale.

ONE PostgreSQL, ONE worker and ONE connector for the module, writing to the session's broker;
one Conflux flow on the session's Spark reads what it wrote. A table with the column types Conflux's CDC path must parse (``numeric(12,2)``,
``timestamptz``, ``jsonb``, ``uuid``, ``text[]``) is snapshotted, then changed by one
multi-statement transaction: the topic holds what the real connector emits (``r`` rows, then
``c``, ``u``, ``d`` and the delete's tombstone, each ``{"schema", "payload"}`` with the change's
LSN and transaction id). Deleting the connector drops its replication slot and publication:
a slot nobody reads pins PostgreSQL's WAL.

:func:`test_kills_of_the_worker_and_of_spark_lose_and_double_nothing` (last: the tests above
expect their connector alone) is change data as databases really send it, on the same
PostgreSQL and worker with a second connector (``skipped.operations=none``: it sends
TRUNCATEs): a table of :data:`SNAPSHOT_ROWS` rows (a few TOASTed) is snapshotted while the worker
is killed -9 in the middle of the snapshot (the topic holds part of it, then all of it again);
then two sessions interleave multi-statement transactions (:mod:`tests.support.pg_workload`:
inserts, updates, updates that change nothing, several updates of a row in one transaction,
deletes, re-inserts, TOASTed values left unchanged, ``numeric(12,2)``, ``numeric``,
``timestamptz``, ``date``, ``jsonb``, ``uuid``, ``integer[]``), the worker is killed -9 two
seconds after an offset flush (it sends those seconds again), a column is added mid-stream and
used, the table is TRUNCATEd and filled again, and a Conflux flow (current state, history,
``truncate: apply``, ``new_columns: evolve``) running as its own Spark application is killed -9
in the middle of a silver batch, then caught up. The truth is PostgreSQL's own: ``SELECT *``
for the current state, and for the history the row versions an audit trigger recorded.
Scale: ``CDC_SNAPSHOT_ROWS`` (800), ``CDC_CHAOS_CHANGES`` (160 statements of random rounds,
plus those written while a kill waits; ``make chaos``: 20,000 and 3,000), ``CDC_SEED``.

PostgreSQL runs as Debian's ``postgres`` user when the suite runs as root (as CI does), so its
runtime folder is outside pytest's temporary folders, which are private to root.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from psycopg2.extras import execute_values
from pyspark.sql import SparkSession

from pipelines.catalog.state import FlowState
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import PROJECT_ROOT, Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import Launches, write_spec
from tests.support.chaos import MID_BATCH, Aim, FlowFiles, kill_mid_batch
from tests.support.delta_read import delta_table, read_rows
from tests.support.pg_workload import (
    ADDED_COLUMN,
    AUDIT_DDL,
    COLUMNS,
    PLACEHOLDER,
    SILVER_SCHEMA,
    TABLE_DDL,
    AuditEntry,
    Round,
    Version,
    Workload,
    audit_entries,
    expected_history,
    run_round,
    table_rows,
    typed,
)
from tests.support.runtime import KafkaBroker, ServiceCli
from tests.support.tables import silver_path

#: A test's time includes its module's teardown (the Connect worker's and PostgreSQL's stops) when
#: it is the module's last: the kill test alone took 598 s in ci35, a slow spell (bench/HISTORY.md,
#: eighteenth session), and its own marker says 1800 too.
pytestmark = pytest.mark.timeout(1800)

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
        try:
            stopped = worker.run("stop", runtime_dir=runtime, timeout=120)
        finally:  # PostgreSQL too, even when the worker's stop timed out
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


# --- change data as databases really send it, killed mid-stream and mid-snapshot ---------------

#: Statements of the workload's random rounds (``make chaos``: more); a few scripted rounds more.
CHAOS_CHANGES = int(os.environ.get("CDC_CHAOS_CHANGES", "160"))
#: Rows of the table's initial snapshot, which the worker is killed in the middle of: enough
#: that the snapshot takes a few seconds.
SNAPSHOT_ROWS = int(os.environ.get("CDC_SNAPSHOT_ROWS", "800"))
CHAOS_SEED = int(os.environ.get("CDC_SEED", "20261127"))
CHAOS_TABLE = "items"
CHAOS_CONNECTOR = "chaos_items"
CHAOS_SLOT = "conflux_chaos_items"
CHAOS_TOPIC = f"cdcchaos.public.{CHAOS_TABLE}"
#: The Delta types of the current table's columns: PostgreSQL's, the added one's as evolved.
CURRENT_TYPES = {
    "id": "integer", "price": "decimal(12,2)", "ratio": "decimal(30,8)", "seen_at": "timestamp",
    "due": "date", "attrs": "string", "ref": "string", "body": "string", "note": "string",
    "tags": {"type": "array", "elementType": "integer", "containsNull": True},
}  # fmt: skip
#: Seconds between two rounds while the worker or the application is to be killed mid-stream.
PACE = 0.15
#: Seconds between two more rounds while a kill waits for changes to come.
FILL_PACE = 1.0
#: After an offset flush, how long the worker keeps sending before it is killed: what it sent
#: since the flush is what it sends again.
AFTER_FLUSH = 2.0


class TopicLog:
    """Every record of a topic so far, as (key, value) JSON, read on demand from its start."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.records: list[tuple[Any, Any]] = []
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
             "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 500}
        )  # fmt: skip
        self._assigned = False

    def end_offset(self) -> int:
        """The topic's high watermark (0 before it exists)."""
        try:
            return int(self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), 2)[1])
        except KafkaException:
            return 0

    def read(self) -> list[tuple[Any, Any]]:
        """Everything up to the current end (at least what was there when called)."""
        end = self.end_offset()
        if end and not self._assigned:
            self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            self._assigned = True
        deadline = time.monotonic() + 60
        while len(self.records) < end:
            assert time.monotonic() < deadline, f"{len(self.records)} of {end} records read"
            message = self._consumer.poll(0.5)
            if message is None or message.error():
                continue
            value = message.value()
            self.records.append((json.loads(message.key() or b"null"), value and json.loads(value)))
        return self.records

    def wait_for(self, found: Any, what: str, timeout: float = 120.0) -> None:
        """Until ``found(payload)`` holds for some record's payload."""
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            records = self.read()
            if any(v is not None and found(v["payload"]) for _, v in records[seen:]):
                return
            seen = len(records)
            assert time.monotonic() < deadline, f"no record {what} in {timeout:.0f} s"
            time.sleep(0.3)

    def close(self) -> None:
        self._consumer.close()


@dataclass(frozen=True)
class Worker:
    """The module's Connect worker, as a process to kill -9 and start again."""

    source: Source

    @property
    def files(self) -> Path:
        return self.source.runtime / "connect"

    def pid(self) -> int:
        return int(json.loads((self.files / "worker.json").read_text())["pid"])

    def offsets_written(self) -> int:
        """When the worker last flushed its offsets (the offsets file's mtime, ns)."""
        offsets = self.files / "offsets.dat"
        return offsets.stat().st_mtime_ns if offsets.exists() else 0

    def kill(self, pid: int) -> None:
        """SIGKILL (a crash: no offset flush, no slot release); wait until it is gone and
        PostgreSQL has let go of its replication slot."""
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid):
            assert time.monotonic() < deadline, f"worker {pid} still runs after SIGKILL"
            time.sleep(0.05)
        sql = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active"
        while self.source.count(sql, CHAOS_SLOT):
            assert time.monotonic() < deadline, f"slot {CHAOS_SLOT} still active"
            time.sleep(0.05)

    def start(self) -> None:
        """Start it again: it resubmits its connectors, which resume from their offsets."""
        started = self.source.worker.run(
            "start", "--bootstrap-servers", self.source.bootstrap_servers,
            runtime_dir=self.source.runtime,
        )  # fmt: skip
        assert started.returncode == 0, self.source.worker.describe(started)
        assert CHAOS_CONNECTOR in self.source.worker.parse(started)["connectors"]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: nobody may reap an orphan here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


class Writer(threading.Thread):
    """Two sessions running the workload's rounds (see :mod:`tests.support.pg_workload`), one
    step after the other: ``("run", rounds)`` runs what ``rounds()`` yields, ``PACE`` apart,
    each round drawn when it runs (from the keys as they are then); ``("fill", event)`` runs
    random rounds more, ``FILL_PACE`` apart, until ``event`` is set (so a kill that waits for
    changes always sees some coming)."""

    def __init__(self, source: Source, workload: Workload) -> None:
        super().__init__(name="cdc-writer", daemon=True)
        self.source, self.workload = source, workload
        self.steps: list[tuple[str, Any]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.last_txid = 0
        self.rounds = 0
        self.statements = 0

    def _connect(self) -> Any:
        return psycopg2.connect(
            host="127.0.0.1", port=self.source.port, user="conflux",
            password=self.source.password, dbname=DATABASE,
        )  # fmt: skip

    def run(self) -> None:
        sessions = {"a": self._connect(), "b": self._connect()}
        try:
            for kind, what in self.steps:
                if kind == "run":
                    for round_ in what():
                        self._run(sessions, round_)
                while kind == "fill" and not what.is_set():
                    self._run(sessions, self.workload.random_round())
                    time.sleep(FILL_PACE)
        except BaseException as exc:
            self.error = exc
        finally:
            for connection in sessions.values():
                connection.close()

    def _run(self, sessions: dict[str, Any], round_: Round) -> None:
        assert not self.stop.is_set(), "stopped"
        self.last_txid = run_round(sessions, round_)
        self.rounds += 1
        self.statements += round_.statements()
        time.sleep(PACE)

    def finish(self, timeout: float = 300.0) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the workload did not finish"
        if self.error is not None:
            raise self.error


def _prepare_chaos_table(source: Source, workload: Workload) -> int:
    """The table, its audit triggers and its snapshot rows; returns the audit's last id then."""
    with source.transaction() as cursor:
        cursor.execute(TABLE_DDL.format(table=CHAOS_TABLE))
        cursor.execute(AUDIT_DDL.format(table=CHAOS_TABLE))
        execute_values(
            cursor, workload.bulk_insert_sql(), workload.bulk_rows(SNAPSHOT_ROWS),
            template=workload.bulk_template(), page_size=1000,
        )  # fmt: skip
        cursor.execute(f"SELECT max(audit_id) FROM public.{CHAOS_TABLE}_audit")
        return int(cursor.fetchone()[0])


def _kill_during_snapshot(source: Source, worker: Worker, log: TopicLog) -> int:
    """Create the connector and kill -9 its worker once part of the snapshot is in the topic
    (paused first, so what is there is known before the kill). Returns how many snapshot
    records the topic holds."""
    created: list[Any] = []
    create = threading.Thread(
        target=lambda: created.append(
            source.worker.run(
                "create", CHAOS_CONNECTOR, "--database", DATABASE,
                "--tables", f"public.{CHAOS_TABLE}", "--topic-prefix", "cdcchaos",
                "--set", "skipped.operations=none", runtime_dir=source.runtime,
            )
        )
    )  # fmt: skip
    pid = worker.pid()
    create.start()
    deadline = time.monotonic() + 120
    while log.end_offset() < max(1, SNAPSHOT_ROWS // 20):
        assert time.monotonic() < deadline, "the snapshot did not start"
        assert create.is_alive() or created[0].returncode == 0, source.worker.describe(created[0])
        time.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)
    if log.end_offset() >= SNAPSHOT_ROWS:
        os.kill(pid, signal.SIGCONT)
        pytest.fail(f"the snapshot of {SNAPSHOT_ROWS} rows was over before the kill: raise it")
    worker.kill(pid)
    create.join(120)
    time.sleep(0.5)  # anything the broker was still being sent
    partial = log.end_offset()
    assert 0 < partial < SNAPSHOT_ROWS, partial
    return partial


def _kill_after_a_flush(worker: Worker, log: TopicLog, killed: threading.Event) -> int:
    """While changes stream, kill -9 the worker ``AFTER_FLUSH`` s after an offset flush (so it
    sends everything since again; ``killed`` set then); start it again. Returns the topic's end
    at the kill."""
    pid, written = worker.pid(), worker.offsets_written()
    deadline = time.monotonic() + 60
    while worker.offsets_written() == written:
        assert time.monotonic() < deadline, "the worker flushed no offsets in 60 s"
        time.sleep(0.02)
    time.sleep(AFTER_FLUSH)
    end = log.end_offset()
    worker.kill(pid)
    killed.set()
    worker.start()
    return end


def _silver_batch_with_rows(files: FlowFiles) -> int | None:
    """The silver batch running now if it reads rows (its offsets reach further into the
    bronze table than the batch before's), else None."""
    planned = files.planned_batches()
    if not planned or files.batch_committed(planned[-1]):
        return None
    batch = planned[-1]

    def reads_to(number: int) -> int:
        logged = (files.checkpoint / "offsets" / str(number)).read_text()
        return int(json.loads(logged.splitlines()[-1])["reservoirVersion"])

    # Bronze's version 0 creates its table: batch 0 has rows when it reads past version 1.
    return batch if reads_to(batch) > (reads_to(batch - 1) if batch else 1) else None


def _chaos_spec(folder: Path) -> FlowSpec:
    return load_spec(
        write_spec(
            folder,
            {
                "name": "cdc_chaos",
                "source": {
                    "kind": "kafka",
                    "topics": [CHAOS_TOPIC],
                    "starting_offsets": "earliest",
                },
                "target": {"table": "bronze_cdc_chaos"},
                "trigger": {"mode": "continuous", "interval": "1 second"},
                "silver": {
                    "format": "debezium",
                    "schema": SILVER_SCHEMA,
                    "events": {"table": "cdc_chaos_events"},
                    "quarantine": {"table": "cdc_chaos_quarantine"},
                    "current": {"table": "cdc_chaos_items", "keys": ["id"]},
                    "history": {"table": "cdc_chaos_items_history"},
                    "debezium": {"truncate": "apply"},
                    "schema_changes": {"new_columns": "evolve"},
                },
            },
        )
    )


@pytest.mark.timeout(1800 if CHAOS_CHANGES <= 1000 and SNAPSHOT_ROWS <= 5000 else 3600)
def test_kills_of_the_worker_and_of_spark_lose_and_double_nothing(
    source: Source, spark: SparkSession, spark_settings: Settings, tmp_path: Path
) -> None:
    """A workload on the real PostgreSQL, captured by a connector sending truncates, through a
    Conflux flow with a current-state and a history table, while the Connect worker is killed
    during the initial snapshot and between two offset flushes, and the Spark application in
    the middle of a silver batch. At the end the current-state table equals ``SELECT *``, value
    for value and type for type; the history table equals the row versions PostgreSQL's audit
    trigger recorded; the events table holds each change once, though the topic holds
    some twice."""
    started = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - started, 1)

    workload = Workload(CHAOS_TABLE, CHAOS_SEED)
    snapshot_audit = _prepare_chaos_table(source, workload)
    worker = Worker(source)
    log = TopicLog(source.bootstrap_servers, CHAOS_TOPIC)
    spec = _chaos_spec(tmp_path / "flows")
    settings = replace(spark_settings, kafka_bootstrap_servers=source.bootstrap_servers)
    paths = {
        role: silver_path(settings, table)
        for role, table in (
            ("events", "cdc_chaos_events"), ("quarantine", "cdc_chaos_quarantine"),
            ("current", "cdc_chaos_items"), ("history", "cdc_chaos_items_history"),
        )
    }  # fmt: skip
    history_files = FlowFiles(
        paths["history"], FlowState.of(spec, settings).stage_checkpoint("silver")
    )
    writer = Writer(source, workload)
    worker_killed, spark_running, spark_killed = (threading.Event() for _ in range(3))

    def part_one() -> Iterator[Round]:
        yield workload.toast_round()
        yield from workload.rounds(CHAOS_CHANGES // 2)

    def part_two() -> Iterator[Round]:
        yield workload.alter_round()
        yield workload.note_round()
        yield from workload.rounds(CHAOS_CHANGES // 8)
        yield workload.truncate_round()
        yield workload.after_truncate_round()
        yield from workload.rounds(CHAOS_CHANGES * 3 // 8)

    writer.steps = [
        ("run", part_one), ("fill", worker_killed), ("fill", spark_running), ("run", part_two),
        ("fill", spark_killed),
    ]  # fmt: skip
    launches = Launches(spec, settings, tmp_path)
    aim = Aim(MID_BATCH)
    try:
        partial = _kill_during_snapshot(source, worker, log)
        lap("the worker killed during the snapshot")
        with launches.run("killed", "continuous") as (group, out):
            # The part of the snapshot in the topic goes through silver before the worker is
            # back: the snapshot taken again lands in a later batch.
            deadline = time.monotonic() + 300
            while not any(history_files.batch_committed(v) for _, v in history_files.txn_commits()):
                assert group.running(), out.tail()
                assert time.monotonic() < deadline, f"no silver batch in 300 s\n{out.tail()}"
                time.sleep(0.3)
            lap("the partial snapshot in silver")
            worker.start()
            log.wait_for(lambda p: p["source"].get("snapshot") == "last", "ending the snapshot")
            lap("the snapshot taken again")
            writer.start()
            killed_at = _kill_after_a_flush(worker, log, worker_killed)
            lap("worker killed mid-stream and started again")
            deadline = time.monotonic() + 300
            while (batch := _silver_batch_with_rows(history_files)) is None:
                assert group.running(), out.tail()
                assert time.monotonic() < deadline, f"no silver batch in 300 s\n{out.tail()}"
                assert writer.error is None, writer.error
                time.sleep(0.1)
            spark_running.set()  # the rest of the workload streams in while the batch runs
            lap("a silver batch with rows")
            landing = kill_mid_batch(
                group, history_files, aim, delay=lambda: random.uniform(1.0, 3.0), tries=8,
                timeout=240, after=batch - 1,
            )  # fmt: skip
            spark_killed.set()
            lap("the application killed mid-batch")
        writer.finish()
        log.wait_for(lambda p: p["source"]["txId"] == writer.last_txid, "of the last transaction")
        lap("the workload in the topic")
        finished, caught_up = launches.catch_up_here(spark)
        assert finished.code == EXIT_OK, caught_up.tail()
        lap("caught up")
        # The killed batch ran again, whole, and every silver write is in its table once.
        (progress,) = [
            p
            for p in caught_up.progress()
            if (p["stage"], p["batch_id"]) == ("silver", landing.batch_id)
        ]
        assert progress["input_rows"] > 0, progress
        for role in ("events", "current", "history"):
            written = FlowFiles(paths[role], history_files.checkpoint).txn_commits()
            assert {txn: v for txn, v in written.items() if len(v) > 1} == {}, role
    finally:
        writer.stop.set()
        if writer.ident is not None:
            writer.join(60)
        log.close()
    records = TopicLog(source.bootstrap_servers, CHAOS_TOPIC)
    topic = records.read()
    records.close()

    with source.transaction() as cursor:
        table = table_rows(cursor, CHAOS_TABLE)
        audit = audit_entries(cursor, CHAOS_TABLE)
    columns = (*COLUMNS, ADDED_COLUMN)
    sent = _topic_summary(topic)
    print(
        f"\nCDC chaos: {SNAPSHOT_ROWS} snapshot rows ({partial} in the topic at the kill), "
        f"{writer.rounds} rounds / {writer.statements} statements, {len(audit)} audit rows; "
        f"worker killed mid-stream at topic offset {killed_at}; Spark killed at "
        f"{landing} ({aim.rate()}); topic {sent}; timings {timings}"
    )
    assert sent["snapshot_reads"] == SNAPSHOT_ROWS + partial, sent
    assert sent["resent_changes"] > 0, f"the worker's kill re-sent nothing: {sent}"
    # What the workload had to produce, it did: placeholders of TOASTed values, a truncate,
    # several updates of a row in one transaction, transactions committed in another order
    # than they began (the two sessions interleaved).
    assert sent["placeholders"] > 0 and sent["truncates"] >= 1, sent
    updates = Counter((e.txid, e.row["id"]) for e in audit if e.op == "UPDATE" and e.row)
    assert max(updates.values()) > 1
    assert _commits_out_of_order(topic, audit) > 0

    # The current state is the table's; the events hold each change once, with its values (a
    # TOASTed one carried, never its placeholder); the history is PostgreSQL's row versions.
    assert read_rows(paths["quarantine"]) == []
    schema = json.loads(delta_table(paths["current"]).schema().to_json())["fields"]
    assert {f["name"]: f["type"] for f in schema if f["name"] in columns} == CURRENT_TYPES
    current = sorted(read_rows(paths["current"]), key=lambda r: r["id"])
    assert [typed(r, columns) for r in current] == [typed(r, columns) for r in table]
    truncate_lsn = _check_events(read_rows(paths["events"]), audit, snapshot_audit)
    _check_history(read_rows(paths["history"]), expected_history(audit, COLUMNS), truncate_lsn)


def _check_events(
    events: list[dict[str, Any]], audit: list[AuditEntry], snapshot_audit: int
) -> int:
    """Each change once (by its identity, and per key in order against the audit: its
    snapshot read, then one event per row change); returns the TRUNCATE's LSN."""
    columns = (*COLUMNS, ADDED_COLUMN)
    identities = Counter((e["id"], e["_source_lsn"], e["_op"]) for e in events)
    assert [i for i, n in identities.items() if n > 1] == []
    (truncate,) = [e for e in events if e["id"] is None]
    assert truncate["_op"] == "t", truncate
    expected = _expected_events(audit, snapshot_audit)
    landed = _events_by_key(events)
    assert landed.keys() == expected.keys()
    for key, changes in expected.items():
        assert [(op, typed(v, columns) if v else None) for op, v in landed[key]] == [
            (op, typed(v, columns) if v else None) for op, v in changes
        ], key
    return int(truncate["_source_lsn"])


def _check_history(
    rows: list[dict[str, Any]], history: dict[int, list[Version]], truncate_lsn: int
) -> None:
    """Per key, the versions' values and current flags are the expected ones in ``_valid_from``
    order, and their intervals chain: an update's version ends where the next begins, a
    delete's before the next (re-insert) begins, a TRUNCATE's at the truncate's LSN."""
    columns = (*COLUMNS, ADDED_COLUMN)
    landed: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        landed.setdefault(row["id"], []).append(row)
    assert landed.keys() == history.keys()
    for key, versions in history.items():
        mine = sorted(landed[key], key=lambda r: r["_valid_from"])
        assert [typed(r, columns) for r in mine] == [typed(v.values, columns) for v in versions], (
            key
        )
        assert [r["_is_current"] for r in mine] == [v.closed_by is None for v in versions], key
        for index, (row, version) in enumerate(zip(mine, versions, strict=True)):
            following = mine[index + 1] if index + 1 < len(mine) else None
            if version.closed_by is None:
                assert row["_valid_to"] is None, (key, row)
                continue
            assert row["_valid_to"] is not None and row["_valid_to"] > row["_valid_from"], row
            if version.closed_by == "update":
                assert following is not None and row["_valid_to"] == following["_valid_from"], key
            elif following is not None:
                assert row["_valid_to"] < following["_valid_from"], (key, row, following)
            if version.closed_by == "truncate":
                assert row["_valid_to"] == truncate_lsn, (key, row)


def _topic_summary(topic: list[tuple[Any, Any]]) -> dict[str, int]:
    """What the connector sent: records, snapshot reads, changes, and changes sent again."""
    changes = Counter(
        (json.dumps(key and key["payload"]), v["payload"]["source"]["lsn"], v["payload"]["op"])
        for key, v in topic
        if v is not None and v["payload"]["op"] != "r"
    )
    payloads = [v["payload"] for _, v in topic if v is not None]
    return {
        "records": len(topic),
        "placeholders": sum(1 for p in payloads if (p["after"] or {}).get("body") == PLACEHOLDER),
        "truncates": sum(1 for p in payloads if p["op"] == "t"),
        "snapshot_reads": sum(1 for _, v in topic if v is not None and v["payload"]["op"] == "r"),
        "changes": len(changes),
        "resent_changes": sum(n - 1 for n in changes.values()),
        "tombstones": sum(1 for _, v in topic if v is None),
    }


def _commits_out_of_order(topic: list[tuple[Any, Any]], audit: list[AuditEntry]) -> int:
    """Transactions the topic holds (in commit order) after one that began later (whose first
    row version has a greater audit id)."""
    began: dict[int, int] = {}
    for entry in audit:
        began.setdefault(entry.txid, entry.audit_id)
    committed = list(
        dict.fromkeys(
            v["payload"]["source"]["txId"]
            for _, v in topic
            if v is not None and v["payload"]["op"] != "r"
        )
    )
    return sum(1 for a, b in pairwise(committed) if began[a] > began[b])


def _expected_events(
    audit: list[AuditEntry], snapshot_audit: int
) -> dict[int, list[tuple[str, dict[str, Any] | None]]]:
    """Per key, the events it must have, in order: its snapshot read, then one per row change
    after the connector started (a delete's values are not compared)."""
    ops = {"INSERT": "c", "UPDATE": "u", "DELETE": "d"}
    expected: dict[int, list[tuple[str, dict[str, Any] | None]]] = {}
    for entry in audit:
        if entry.row is None:
            continue
        op = "r" if entry.audit_id <= snapshot_audit else ops[entry.op]
        values = None if op == "d" else entry.row
        expected.setdefault(entry.row["id"], []).append((op, values))
    return expected


def _events_by_key(events: list[dict[str, Any]]) -> dict[int, list[tuple[str, Any]]]:
    by_key: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event["id"] is not None:
            by_key.setdefault(event["id"], []).append(event)
    return {
        key: [
            (e["_op"], None if e["_op"] == "d" else e)
            for e in sorted(rows, key=lambda e: e["_source_lsn"])
        ]
        for key, rows in by_key.items()
    }

"""Table maintenance beside a running flow (real Kafka, Spark and Delta; delta-rs reads back).

One flow, ``maint``: a Kafka topic into bronze in small batches (continuous, 10 records per
trigger), and silver as its own query (``chaining: stream``) into events, quarantine and a
current-state table (MERGE, Z-ordered by ``name``).

1. **OPTIMIZE while the flow commits.** With the flow running continuously and records still
   arriving, :func:`pipelines.maintenance.maintain_flow` OPTIMIZEs and VACUUMs every table: both
   sides succeed (a MERGE that loses its commit race to OPTIMIZE is retried by the stage; an
   OPTIMIZE that loses is retried by maintenance), the stream commits while maintenance runs,
   each OPTIMIZE commit holds exactly the rows of the version before it in fewer files (bronze,
   events) or no more (delta-rs reads both versions), and in the end every record is in bronze
   once and every parsed one in events once.
2. **VACUUM never removes a file a stream still needs.** Bronze runs on alone (the same flow
   without its silver section), so the silver checkpoint stays behind; OPTIMIZE then replaces the
   small files silver has not read, and VACUUM runs with the computed retention. Every file the
   silver stream still needs (added at or after the version in its checkpoint) is still there,
   and silver catches up without error. The control: the same VACUUM with a retention that
   ignores the stream (0 hours, on a copy of the table and of the silver checkpoint) deletes those
   files, and a stream restarted from the copied checkpoint fails.

Small on purpose (122 records, 13 bronze batches of at most 10): the point is the interleaving, not the
volume. Maintenance starts with records waiting in Kafka and more arriving, so the stream commits
while it runs; a longer backlog would only make the stream and maintenance slow each other down on
the shared cores.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import QueryBuilder
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from pipelines.catalog.tables import declared_paths
from pipelines.location import Location
from pipelines.maintenance import (
    TableReport,
    maintain_flow,
    maintain_table,
    vacuum_session,
)
from pipelines.reporting import Reporter
from pipelines.retention import (
    flow_tables,
    latest_version,
    stream_readers,
    stream_start_version,
)
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_source_faults import background_flow
from tests.support.delta_read import delta_table
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker

TOPIC = "maintenance_orders"
KEYS = 20
FIRST, DURING, LATER, LAST = 40, 40, 30, 10
BAD = [(b"bad-1", b"\xff not utf-8"), (b"bad-2", b'{"id": 1, "name": "trunc')]


def records(start: int, count: int) -> list[tuple[bytes | None, bytes | None]]:
    """Upserts of KEYS keys; the sequence is the record number, so the newest name wins."""
    return [
        (
            json.dumps({"id": i % KEYS}).encode(),
            json.dumps({"id": i % KEYS, "name": f"v{i}", "seq": i}).encode(),
        )
        for i in range(start, start + count)
    ]


def flow(with_silver: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "maint",
        "source": {"kind": "kafka", "topics": [TOPIC], "max_offsets_per_trigger": 10},
        "target": {"table": "bronze_maint"},
        "trigger": {"mode": "continuous", "interval": "1 second"},
    }
    if with_silver:
        spec["silver"] = {
            "format": "json",
            "schema": "id BIGINT, name STRING, seq BIGINT",
            "current": {
                "table": "maint_current",
                "keys": ["id"],
                "sequence_by": "seq",
                "z_order_by": ["name"],
            },
        }
    return spec


# --- reading the tables and their logs, without Spark ----------------------------------------------


def commits(table: Location) -> list[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
    """(version, commitInfo, add actions) of every commit file in the table's log."""
    log = table / "_delta_log"
    result = []
    for name in log.names():  # sorted
        stem = name.removesuffix(".json")
        if stem == name or not stem.isdigit():
            continue
        info: dict[str, Any] = {}
        adds = []
        for line in (log / name).read_text().splitlines():
            action = json.loads(line)
            info = action.get("commitInfo", info)
            if "add" in action:
                adds.append(action["add"])
        result.append((int(stem), info, adds))
    return result


def rows(table: Location, order_by: str, version: int | None = None) -> list[dict[str, Any]]:
    """The table's rows at ``version`` (default latest) as delta-rs reads them (its QueryBuilder:
    deletion vectors too), ordered."""
    delta = delta_table(table, version)
    query = f"SELECT * FROM t ORDER BY {order_by}"
    return pa.table(QueryBuilder().register("t", delta).execute(query).read_all()).to_pylist()


def bronze_offsets(table: Location) -> list[int]:
    return sorted(delta_table(table).to_pyarrow_table(columns=["offset"])["offset"].to_pylist())


def event_offsets(table: Location) -> list[int]:
    if not (table / "_delta_log").exists():
        return []
    return [r["_source_offset"] for r in rows(table, "_source_offset")]


def expected_current(total: int) -> dict[int, str]:
    return {key: f"v{max(i for i in range(total) if i % KEYS == key)}" for key in range(KEYS)}


def parsed_offsets(total_valid: int) -> list[int]:
    """Offsets of the parsable records: the bad ones sit right after the first FIRST records."""
    return [i if i < FIRST else i + len(BAD) for i in range(total_valid)]


def assert_optimize_kept_the_data(table: Location, order_by: str) -> int:
    """Every OPTIMIZE commit of ``table`` holds the rows of the version before it in no more
    files; returns how many of them dropped the file count.

    Version against version, because the stream keeps adding files around the OPTIMIZE: the
    table's file count before and after maintenance proves nothing while it runs.
    """
    dropped = 0
    for version, info, _ in commits(table):
        if info.get("operation") != "OPTIMIZE":
            continue
        assert rows(table, order_by, version) == rows(table, order_by, version - 1), (
            f"{table}: OPTIMIZE at version {version} changed the data"
        )
        files = [len(delta_table(table, v).file_uris()) for v in (version - 1, version)]
        assert files[1] <= files[0], f"{table}: OPTIMIZE at version {version}: {files} files"
        dropped += files[1] < files[0]
    return dropped


def by_role(reports: list[TableReport]) -> dict[str, TableReport]:
    return {r.role: r for r in reports}


# --- the test ------------------------------------------------------------------------------------


def test_maintenance_beside_a_running_flow(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    create_topic(bootstrap, TOPIC, partitions=1)
    half = FIRST // 2
    produce(bootstrap, TOPIC, records(0, half))
    spec = load_spec(write_spec(tmp_path / "flows", flow()))
    paths = declared_paths(spec, spark_settings)
    bronze, events, current = paths["bronze"], paths["events"], paths["current"]

    # 1. OPTIMIZE (and VACUUM) while the continuous flow keeps committing.
    with background_flow(spec, spark_settings, spark, tmp_path) as running:
        # Two silver batches with rows before maintenance, whatever the pace: the second half is
        # sent once the first batch committed, so events holds two files or more to compact.
        running.wait_until(lambda: latest_version(events) >= 1, 300, "a first silver batch")
        produce(bootstrap, TOPIC, records(half, FIRST - half) + BAD)
        running.wait_until(
            lambda: (
                latest_version(bronze) >= 4
                and latest_version(events) >= 2
                and latest_version(current) >= 1
            ),
            300,
            "four bronze commits, two silver appends and a first MERGE into the current table",
        )

        # Records keep arriving: the first ten are in Kafka before maintenance starts (bronze has
        # a batch to commit while it runs), twenty trickle in during it, the last ten after it:
        # the stream commits on the tables OPTIMIZE and VACUUM are rewriting.
        produce(bootstrap, TOPIC, records(FIRST, 10))

        def trickle() -> None:
            for start in range(FIRST + 10, FIRST + DURING - 10, 10):
                time.sleep(0.5)
                produce(bootstrap, TOPIC, records(start, 10))

        producer = threading.Thread(target=trickle, daemon=True)
        producer.start()
        started_ms = time.time() * 1000
        reports = by_role(maintain_flow(spark, spec, spark_settings))
        ended_ms = time.time() * 1000
        producer.join(120)
        produce(bootstrap, TOPIC, records(FIRST + DURING - 10, 10))

        total = FIRST + len(BAD) + DURING
        running.wait_until(
            lambda: (
                len(bronze_offsets(bronze)) >= total
                and len(event_offsets(events)) >= FIRST + DURING
            ),
            300,
            "every record in bronze and events",
        )
        assert running.finish() == EXIT_OK  # the stream never failed

    for role in ("bronze", "events", "quarantine", "current"):
        report = reports[role]
        assert report.ok, report.summary()
        assert report.optimized and report.vacuumed, report.summary()
        assert report.retention_hours == 7 * 24, report.summary()  # silver is not days behind
        assert report.files_removed is not None and report.files_added is not None
        assert report.files_added <= report.files_removed, report.summary()
    for role in ("bronze", "events"):  # one or more small files per batch before
        assert reports[role].files_added < reports[role].files_removed, reports[role].summary()

    stream_commits = [
        info["timestamp"]
        for _, info, _ in commits(bronze)
        if info.get("operation") != "OPTIMIZE"
        and not info.get("operation", "").startswith("VACUUM")
    ]
    assert any(started_ms <= t <= ended_ms for t in stream_commits), (
        "the flow committed nothing to bronze while maintenance ran"
    )
    assert assert_optimize_kept_the_data(bronze, "partition, offset") >= 1
    assert assert_optimize_kept_the_data(events, "_source_offset") >= 1
    assert_optimize_kept_the_data(current, "id")
    assert bronze_offsets(bronze) == list(range(total))  # every record once
    assert event_offsets(events) == parsed_offsets(FIRST + DURING)
    assert {r["id"]: r["name"] for r in rows(current, "id")} == expected_current(FIRST + DURING)

    # 2. Silver behind bronze: VACUUM keeps what its stream still reads.
    produce(bootstrap, TOPIC, records(FIRST + DURING, LATER))
    bronze_only = load_spec(write_spec(tmp_path / "bronze_only", flow(with_silver=False)))
    assert run_once(spark, spark_settings, bronze_only) == EXIT_OK
    [reader] = stream_readers(spec, spark_settings)
    position = stream_start_version(reader.checkpoint)  # read from Spark's real offsets file
    assert position is not None and position < latest_version(bronze)
    needed = needed_files(bronze, position)
    assert len(needed) >= LATER // 10  # bronze's batches since silver's last one
    current_before = rows(current, "id")

    tables = {t.role: t for t in flow_tables(spec, spark_settings)}
    readers = stream_readers(spec, spark_settings)
    reports = {  # the two tables this part is about; part 1 maintained them all
        role: maintain_table(spark, spec, tables[role], readers, do_optimize=True, do_vacuum=True)
        for role in ("bronze", "current")
    }

    assert reports["bronze"].ok and reports["bronze"].optimized, reports["bronze"].summary()
    assert reports["bronze"].vacuumed and reports["bronze"].retention_hours >= 7 * 24
    live = {Path(uri).name for uri in delta_table(bronze).file_uris()}
    assert live.isdisjoint(Path(f).name for f in needed)  # OPTIMIZE replaced them
    assert [f for f in needed if not (bronze / f).exists()] == []  # VACUUM kept them
    assert reports["current"].ok and reports["current"].optimized  # Z-ordered by name
    assert rows(current, "id") == current_before

    copy, checkpoint_copy = tmp_path / "bronze_copy", tmp_path / "silver_checkpoint_copy"
    shutil.copytree(Path(bronze), copy)  # the flow's local lake and checkpoints (spark_settings)
    shutil.copytree(Path(reader.checkpoint), checkpoint_copy)
    assert_unsafe_vacuum_breaks_the_stream(spark, copy, checkpoint_copy, needed)

    # Silver catches up, with a few new records for bronze.
    produce(bootstrap, TOPIC, records(FIRST + DURING + LATER, LAST))
    assert run_once(spark, spark_settings, spec) == EXIT_OK
    valid = FIRST + DURING + LATER + LAST
    assert bronze_offsets(bronze) == list(range(valid + len(BAD)))
    assert event_offsets(events) == parsed_offsets(valid)
    assert {r["id"]: r["name"] for r in rows(current, "id")} == expected_current(valid)


def run_once(spark: SparkSession, settings: Settings, spec: FlowSpec) -> int:
    """One ``available_now`` run of the flow in this process."""
    return run_flows([spec], settings, Reporter(), StopRequest(None), "available_now", spark=spark)


def needed_files(table: Location, position: int) -> list[str]:
    """The data files a Delta stream at ``position`` still reads: added with a data change at or
    after it."""
    return [
        add["path"]
        for version, _, adds in commits(table)
        if version >= position
        for add in adds
        if add.get("dataChange", True)
    ]


def assert_unsafe_vacuum_breaks_the_stream(
    spark: SparkSession, table: Path, checkpoint: Path, needed: list[str]
) -> None:
    """The control: a retention that ignores the stream deletes the files it needs, and the stream
    fails. On copies, in a session of its own (Delta's safety check off there only)."""
    unsafe = vacuum_session(spark)
    unsafe.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    unsafe.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS").collect()
    assert [f for f in needed if not (table / f).exists()], "nothing needed was deleted"
    query = (
        unsafe.readStream.format("delta")
        .load(str(table))
        .writeStream.foreachBatch(lambda frame, _batch: frame.count())
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException):
            query.awaitTermination(180)
    finally:
        query.stop()

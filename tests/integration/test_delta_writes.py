"""Idempotent writes keep Delta's per-commit work off the micro-batch's path (issue 12), and a
flow's start reads its tables' metadata without reconstructing their state.

After each commit, :func:`prepare_next_transaction` reconstructs the new snapshot's state in the
background (the next write's transaction-id check needs it) and, for a table created with
:data:`BACKGROUND_CHECKPOINT_PROPERTIES`, writes Delta's checkpoint every
:data:`BACKGROUND_CHECKPOINT_EVERY` commits: Delta itself would do it inside the commit only
every 1,000.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from pipelines import delta_writes
from pipelines.delta_writes import (
    BACKGROUND_CHECKPOINT_PROPERTIES,
    TableHeader,
    append_idempotently,
    table_header,
    wait_for_background_work,
)


def _checkpoints(table: Path) -> list[int]:
    return sorted(
        int(p.name.split(".")[0]) for p in (table / "_delta_log").glob("[0-9]*.checkpoint.parquet")
    )


def _create(spark: SparkSession, path: Path, properties: dict[str, str]) -> None:
    builder = DeltaTable.createIfNotExists(spark).location(str(path)).addColumn("id", "BIGINT")
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


def test_background_checkpoints_and_txn_state(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delta_writes, "BACKGROUND_CHECKPOINT_EVERY", 3)
    ours, plain = tmp_path / "ours", tmp_path / "plain"
    _create(spark, ours, BACKGROUND_CHECKPOINT_PROPERTIES)
    _create(spark, plain, {})
    jvm = spark.sparkContext._jvm
    for batch_id in range(7):
        for path in (ours, plain):
            rows = spark.range(batch_id * 10, batch_id * 10 + 10)
            write = append_idempotently(rows, path.name, "bronze", str(path), "app", batch_id)
            assert write.version == batch_id + 1 and write.rows == 10 and not write.skipped
            wait_for_background_work()  # deterministic: each checkpoint decision sees its commit
            log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
            # the new snapshot's state was reconstructed in the background, before any write
            assert log.unsafeVolatileSnapshot()._computedStateTriggered()
    # Conflux checkpointed the table that leaves it checkpoints (versions 3 and 6); the other
    # keeps Delta's own schedule (none before version 10) and gets none from the background.
    assert _checkpoints(ours) == [3, 6]
    assert _checkpoints(plain) == []
    replay = append_idempotently(spark.range(3), "ours", "bronze", str(ours), "app", 6)
    assert replay.skipped  # the reconstructed state still answers the transaction-id check
    assert spark.read.format("delta").load(str(ours)).count() == 70
    wait_for_background_work()


def test_table_header_reads_the_latest_version_with_no_spark_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What a start checks of each table (properties, partitions, whether it holds data) comes
    from the Delta log's metadata and checksum: no job, so no state reconstruction per table;
    and from the latest version even when this session's Delta log cache holds an older one."""
    path = tmp_path / "events"
    assert table_header(spark, str(path)) is None
    DeltaTable.createIfNotExists(spark).location(str(path)).addColumn("id", "BIGINT").addColumn(
        "day", "STRING"
    ).partitionedBy("day").property("conflux.flow", "orders").execute()
    empty = header_without_jobs(spark, str(path))
    assert empty is not None and not empty.has_data
    assert empty.partition_columns == ["day"] and empty.properties["conflux.flow"] == "orders"
    spark.createDataFrame([(1, "2026-11-28")], "id BIGINT, day STRING").write.format("delta").mode(
        "append"
    ).save(str(path))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('conflux.generation' = '2')")
    written = header_without_jobs(spark, str(path))
    with jobs_of(spark) as jobs:  # what the start used to ask: the same answer, from Spark jobs
        detail = DeltaTable.forPath(spark, str(path)).detail().first()
    assert jobs(), "the job count sees Delta's state reconstruction"
    assert detail is not None and written == TableHeader(
        properties=dict(detail["properties"]),
        partition_columns=list(detail["partitionColumns"]),
        has_data=detail["numFiles"] > 0,
    )
    assert written.has_data and written.properties["conflux.generation"] == "2"
    # another writer's commit (delta-rs, which writes no checksum file) to a table this session
    # last saw empty: the latest version is read, its file count from the reconstructed state
    other = tmp_path / "other"
    DeltaTable.createIfNotExists(spark).location(str(other)).addColumn("id", "BIGINT").execute()
    seen = table_header(spark, str(other))
    assert seen is not None and not seen.has_data
    write_deltalake(str(other), pa.table({"id": [2]}), mode="append")
    assert not (other / "_delta_log" / f"{1:020d}.crc").exists()
    latest = table_header(spark, str(other))
    assert latest is not None and latest.has_data


@contextmanager
def jobs_of(spark: SparkSession) -> Iterator[Callable[[], list[int]]]:
    """The Spark jobs this thread starts in the block (a job group of its own). The status
    tracker is fed by the listener bus: it is drained before each look."""
    context = spark.sparkContext
    group = f"jobs-{uuid.uuid4().hex}"
    context.setJobGroup(group, "counted by the test")

    def jobs() -> list[int]:
        context._jsc.sc().listenerBus().waitUntilEmpty()
        return list(context.statusTracker().getJobIdsForGroup(group))

    try:
        yield jobs
    finally:
        context._jsc.clearJobGroup()


def header_without_jobs(spark: SparkSession, path: str) -> TableHeader | None:
    """:func:`table_header` as a restart reads it (this session's Delta log cache emptied, so
    the checksum comes from storage), asserting it ran no Spark job."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    with jobs_of(spark) as jobs:
        header = table_header(spark, path)
    assert jobs() == [], "table_header ran Spark jobs"
    return header

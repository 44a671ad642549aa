"""Idempotent Delta writes: every write of a micro-batch carries a transaction id.

Delta records ``(appId, version)`` pairs in the commit that writes the rows and skips a later write
whose ``txnVersion`` is not greater than the one it holds for that ``appId``. A stage passes one app
id per target table and checkpoint generation, and the micro-batch id as the version, so a batch
that Spark replays after a crash (same batch id, same input) changes nothing it already committed:

* appends take the writer options ``txnAppId`` / ``txnVersion`` (:func:`append_idempotently`);
* MERGE has no writer options: it reads the session confs ``spark.databricks.delta.write.txnAppId``
  / ``txnVersion``, set here on the *batch's own* session (``batch_df.sparkSession``) for the
  duration of one command (:func:`idempotent_session`). Structured Streaming gives each query's
  ``foreachBatch`` a session of its own, so queries running side by side never see each other's ids.

After a write, :func:`committed_write` reads the commit files the write added (no Spark job: plain
Hadoop FileSystem reads of ``_delta_log``) and says what Delta did: the version that holds the
batch's transaction id and its row count, or that the write was a replay Delta skipped.

A MERGE that meets a concurrent OPTIMIZE (table maintenance) is retried under the same
transaction id (:func:`retry_on_maintenance`): maintenance never fails a stream.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
)
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from pipelines.progress import delta_version

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
#: Delta's row-count metric of each operation, for the rows a commit wrote or changed.
_ROW_METRICS = {
    "WRITE": ("numOutputRows",),
    "STREAMING UPDATE": ("numOutputRows",),
    "MERGE": ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted"),
}


@dataclass(frozen=True)
class TableWrite:
    """What one idempotent write of a micro-batch did to one table."""

    table: str
    role: str
    version: int | None
    rows: int
    skipped: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "role": self.role,
            "version": self.version,
            "rows": self.rows,
            "skipped": self.skipped,
        }


def table_properties(spark: SparkSession, path: str) -> dict[str, str] | None:
    """The Delta table's properties, or None if there is no Delta table at ``path``."""
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    row = DeltaTable.forPath(spark, path).detail().select("properties").first()
    return dict(row["properties"] or {}) if row is not None else {}


def commit_actions(spark: SparkSession, table_path: str, version: int) -> list[dict[str, Any]]:
    """The actions of the Delta commit ``version``, read from ``_delta_log`` with no Spark job.

    Goes through Hadoop's FileSystem, so it reads wherever Spark can (local, HDFS, object stores).
    """
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{table_path}/_delta_log/{version:020d}.json")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.open(path)
    try:
        text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def rows_of(commit_info: dict[str, Any]) -> int:
    metrics = commit_info.get("operationMetrics") or {}
    names = _ROW_METRICS.get(str(commit_info.get("operation")), ("numOutputRows",))
    return sum(int(metrics.get(name, 0)) for name in names)


def find_commit(
    spark: SparkSession, table_path: str, versions: range, app_id: str, batch_id: int
) -> tuple[int, int] | None:
    """(version, rows written) of the commit in ``versions`` that carries txn (app_id, batch_id)."""
    for version in versions:
        actions = commit_actions(spark, table_path, version)
        txns = [a["txn"] for a in actions if "txn" in a]
        if any(t.get("appId") == app_id and int(t.get("version", -1)) == batch_id for t in txns):
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            return version, rows_of(info)
    return None


def committed_write(
    spark: SparkSession,
    table: str,
    role: str,
    table_path: str,
    before: int | None,
    app_id: str,
    batch_id: int,
) -> TableWrite:
    """What the write of ``batch_id`` that started at table version ``before`` committed."""
    after = delta_version(spark, table_path)
    # Versions committed since the write started, if any: a replay Delta skipped adds none, even
    # when the newest commit is that very batch's first attempt.
    new_versions = range((-1 if before is None else before) + 1, (after or 0) + 1)
    found = find_commit(spark, table_path, new_versions, app_id, batch_id)
    if found is None:
        return TableWrite(table, role, None, 0, skipped=True)
    return TableWrite(table, role, found[0], found[1], skipped=False)


def append_idempotently(
    frame: DataFrame,
    table: str,
    role: str,
    table_path: str,
    app_id: str,
    batch_id: int,
    partition_by: Sequence[str] = (),
) -> TableWrite:
    """Append ``frame`` to the table under txn (app_id, batch_id); a replayed batch is skipped."""
    spark = frame.sparkSession
    before = delta_version(spark, table_path)
    writer = (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", str(batch_id))
    )
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(table_path)
    return committed_write(spark, table, role, table_path, before, app_id, batch_id)


@contextmanager
def idempotent_session(spark: SparkSession, app_id: str, batch_id: int) -> Iterator[None]:
    """Delta DML (MERGE, UPDATE, DELETE) in this block carries txn (app_id, batch_id).

    ``spark`` must be the micro-batch's own session (``batch_df.sparkSession``). The confs are
    removed afterwards, so no later write of the session inherits them.
    """
    spark.conf.set(TXN_APP_ID_CONF, app_id)
    spark.conf.set(TXN_VERSION_CONF, str(batch_id))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)


#: Conflicts a MERGE can meet from table maintenance (OPTIMIZE rewriting the files it read).
#: ``ConcurrentTransactionException`` is not among them: that is another writer of the same
#: transaction id, i.e. a second run, and must fail.
MAINTENANCE_CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
)


def retry_on_maintenance(
    write: Callable[[], None], table: str, batch_id: int, attempts: int = 5
) -> None:
    """Run a Delta DML ``write``; on a conflict with maintenance, run it again (same session, so
    the same transaction version), up to ``attempts`` times with growing pauses.

    Safe because the conflicting commit changed no data (OPTIMIZE, VACUUM's log entries) and the
    lease keeps any other writer away; the failed attempt committed nothing.
    """
    for attempt in range(1, attempts + 1):
        try:
            write()
            return
        except MAINTENANCE_CONFLICTS as exc:
            if attempt == attempts:
                raise
            pause = min(0.5 * 2**attempt, 8.0)
            log.warning(
                "%s: batch %d conflicted with a concurrent commit (%s); retrying in %.1f s",
                table,
                batch_id,
                type(exc).__name__,
                pause,
            )
            time.sleep(pause)

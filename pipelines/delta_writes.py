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

Then it starts :func:`prepare_next_transaction` in the background: the next write's transaction-id
check needs the table's reconstructed state, which Delta builds with Spark jobs; started at the
commit, it overlaps with the stream's bookkeeping and any wait for the next trigger (batches that
run back to back still wait for it), and it writes the checkpoints of the tables created for it
(:data:`BACKGROUND_CHECKPOINT_PROPERTIES`: bronze and silver).

A MERGE that meets a concurrent OPTIMIZE (table maintenance) is retried under the same
transaction id (:func:`retry_on_maintenance`): maintenance never fails a stream.
"""

from __future__ import annotations

import json
import logging
import threading
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
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql import DataFrame, SparkSession

# Defined beside the messages it travels in; the writes here make them.
from pipelines.messages import TableWrite as TableWrite
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
class TableHeader:
    """What a flow checks of an existing Delta table before it writes: its latest version's
    properties, partition columns and whether it holds any data file."""

    properties: dict[str, str]
    partition_columns: list[str]
    has_data: bool


def table_header(spark: SparkSession, path: str) -> TableHeader | None:
    """The latest version's :class:`TableHeader`, or None if there is no Delta table at ``path``.

    Read from the Delta log's protocol and metadata and the version's checksum file (``.crc``,
    which Delta writes with every commit unless ``writeChecksumFile`` is off): no Spark job.
    ``DeltaTable.detail()`` answers the same from the snapshot's reconstructed state, 3 Spark
    jobs per table, which a start paid for every table of the flow before its first batch
    (~0.5-1.5 s a table, bench/HISTORY.md). Without a checksum (e.g. a commit delta-rs made),
    Delta reads the metadata and counts the files with Spark jobs. If Delta's internal API has
    changed, ``detail()`` answers (a warning says so, once); errors of the table itself (storage,
    a corrupt log) are raised as they are.
    """
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    jvm: Any = spark.sparkContext._jvm
    try:
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        none = jvm.scala.Option.empty()
        snapshot = delta_log.update(False, none, none)  # the latest version, not a cached one
        metadata = snapshot.metadata()
        scala = jvm.scala.jdk.javaapi.CollectionConverters
        checksum = snapshot.checksumOpt()
        files = checksum.get().numFiles() if checksum.isDefined() else snapshot.numOfFiles()
        return TableHeader(
            properties=dict(scala.asJava(metadata.configuration())),
            partition_columns=list(scala.asJava(metadata.partitionColumns())),
            has_data=int(files) > 0,
        )
    except Py4JJavaError:
        raise  # the table's own error: detail() would meet it again, three jobs later
    except (Py4JError, TypeError) as exc:  # no such method, or class ('JavaPackage' not callable)
        if "table_header()" not in _warned:  # the other keys are table paths
            _warned.add("table_header()")
            log.warning("Delta's log API changed (%s): table checks use DeltaTable.detail()", exc)
    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail is not None
    return TableHeader(
        properties=dict(detail["properties"] or {}),
        partition_columns=list(detail["partitionColumns"] or []),
        has_data=int(detail["numFiles"] or 0) > 0,
    )


def table_properties(spark: SparkSession, path: str) -> dict[str, str] | None:
    """The Delta table's properties, or None if there is no Delta table at ``path``."""
    header = table_header(spark, path)
    return None if header is None else header.properties


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
    prepare_next_transaction(spark, table_path)
    if found is None:
        return TableWrite(table, role, None, 0, skipped=True)
    return TableWrite(table, role, found[0], found[1], skipped=False)


#: Delta checkpoints a table every ``delta.checkpointInterval`` commits (10 by default), inside
#: the commit that reaches it: ~1 s on two cores, paid by that micro-batch. Tables a stream writes
#: in every batch (bronze, the silver tables) are created with these properties instead, so
#: Delta's own checkpoint is a rare safety net, and :func:`prepare_next_transaction` checkpoints
#: every :data:`BACKGROUND_CHECKPOINT_EVERY` commits off the batch's path.
BACKGROUND_CHECKPOINT_PROPERTIES = {"delta.checkpointInterval": "1000"}
BACKGROUND_CHECKPOINT_EVERY = 100
_background: set[threading.Thread] = set()
_checkpointing: set[str] = set()
_last_checkpoint: dict[str, int] = {}
_warned: set[str] = set()
_background_lock = threading.Lock()


def prepare_next_transaction(spark: SparkSession, table_path: str) -> threading.Thread:
    """Reconstruct the table's latest snapshot state in a background thread, and checkpoint it
    if the table leaves checkpoints to Conflux (:data:`BACKGROUND_CHECKPOINT_PROPERTIES`).

    Why: a write with a transaction id asks Delta for the versions the table holds per app id.
    Delta 4.4 answers from the snapshot's reconstructed state (the checksum file has them, but this
    version does not read them from it), which costs three Spark jobs: ~0.35 s on two cores for a
    micro-batch of a few hundred rows that otherwise writes in ~0.2 s, more as the log grows.
    Started right after a commit, the reconstruction of the new snapshot overlaps with the
    stream's commit log, its progress report and the wait for the next trigger, if any. The state
    is a lazy value of the snapshot object: the next write finds it computed, or waits for this
    very computation (never a second one); a newer commit in between only leaves this one unused.
    Measured (bench/HISTORY.md): this alone gains nothing when batches run back to back; the
    checkpoint it writes instead of the commit is what took the latency spikes off the batches.
    """
    thread = threading.Thread(
        target=_prepare, args=(spark, table_path), name="conflux-next-txn", daemon=True
    )
    with _background_lock:
        _background.add(thread)
    thread.start()
    return thread


def _prepare(spark: SparkSession, table_path: str) -> None:
    try:
        jvm: Any = spark.sparkContext._jvm
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            spark._jsparkSession, table_path
        )
        snapshot = delta_log.unsafeVolatileSnapshot()
        snapshot.setTransactions()
        with _background_lock:
            if table_path in _checkpointing or not _checkpoint_due(table_path, snapshot):
                return
            _checkpointing.add(table_path)
        try:
            delta_log.checkpoint(snapshot, jvm.scala.Option.empty())
            _last_checkpoint[table_path] = int(snapshot.version())
        finally:
            with _background_lock:
                _checkpointing.discard(table_path)
    except Exception as exc:  # never fails a stream: at worst the next write is slower
        if table_path not in _warned:
            _warned.add(table_path)
            log.warning(
                "background snapshot / checkpoint of %s failed (%s); the stream goes on, and "
                "Delta checkpoints the table itself every %s commits",
                table_path,
                exc,
                BACKGROUND_CHECKPOINT_PROPERTIES["delta.checkpointInterval"],
            )
    finally:
        with _background_lock:
            _background.discard(threading.current_thread())


def _checkpoint_due(table_path: str, snapshot: Any) -> bool:
    """Whether Conflux checkpoints this table (its interval is ours) and one is due.

    Not at a multiple of the table's interval: Delta checkpointed that version in its commit.
    """
    interval = snapshot.metadata().configuration().get("delta.checkpointInterval")
    ours = BACKGROUND_CHECKPOINT_PROPERTIES["delta.checkpointInterval"]
    if not interval.isDefined() or str(interval.get()) != ours:
        return False
    version = int(snapshot.version())
    if version % int(ours) == 0:
        return False
    in_log = int(snapshot.logSegment().checkpointProvider().version())
    last = max(in_log, _last_checkpoint.get(table_path, -1), 0)
    return version - last >= BACKGROUND_CHECKPOINT_EVERY


def wait_for_background_work(timeout: float = 60.0) -> None:
    """Let snapshot reconstructions and checkpoints in flight finish (call before stopping the
    session: a Spark job cut short by ``spark.stop()`` logs errors and leaves no checkpoint)."""
    deadline = time.monotonic() + timeout
    with _background_lock:
        pending = list(_background)
    for thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))


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
def idempotent_session(
    spark: SparkSession, app_id: str, batch_id: int, target: str | None = None
) -> Iterator[None]:
    """Delta DML (MERGE, UPDATE, DELETE) in this block carries txn (app_id, batch_id).

    ``spark`` must be the micro-batch's own session (``batch_df.sparkSession``). The confs are
    removed afterwards, so no later write of the session inherits them. ``target``: the table the
    block's DML writes; below :data:`DELETION_VECTORS_FROM_BYTES` it rewrites the files it
    touches instead of writing deletion vectors (:func:`deletion_vectors_pay`).
    """
    confs: dict[str, str] = {TXN_APP_ID_CONF: app_id, TXN_VERSION_CONF: str(batch_id)}
    if target is not None and not deletion_vectors_pay(spark, target):
        confs.update(dict.fromkeys(PERSISTENT_DV_CONFS, "false"))
    with session_confs(spark, confs):
        yield


@contextmanager
def session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """``confs`` set on ``spark`` for the block; each key's earlier value (or its absence)
    restored afterwards."""
    earlier: dict[str, str | None] = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, previous in earlier.items():
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)


#: A table's size from which its DML writes deletion vectors (when the table has them on).
#: Below it, a MERGE rewrites the files it touches. Why: writing deletion vectors is a fixed cost
#: of about eight Spark jobs per MERGE (0.6-0.9 s on two cores), and rewriting a small table's
#: touched files costs less: a MERGE of 2,500 upserts into a 20,000-key current table took 1.4 s
#: rewriting, 2.3 s with deletion vectors. At 10M keys (~200 MB) deletion vectors made the MERGE
#: 1.9x faster; at 1M keys (~25 MB) they made no difference (bench/HISTORY.md).
DELETION_VECTORS_FROM_BYTES = 64 * 1024 * 1024
#: Delta's session switches for deletion vectors in MERGE, UPDATE and DELETE (default on).
PERSISTENT_DV_CONFS = tuple(
    f"spark.databricks.delta.{command}.deletionVectors.persistent"
    for command in ("merge", "update", "delete")
)


def deletion_vectors_pay(spark: SparkSession, table_path: str) -> bool:
    """Whether DML into the table should write deletion vectors: when it is at least
    :data:`DELETION_VECTORS_FROM_BYTES`, or its size is unknown.

    Reads the size of the snapshot Delta already holds for the table (the DML needs that
    snapshot's state anyway), with no Spark job of its own when it is already computed."""
    try:
        jvm: Any = spark.sparkContext._jvm
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            spark._jsparkSession, table_path
        )
        size = int(delta_log.unsafeVolatileSnapshot().sizeInBytes())
    except Exception:  # an internal API changed: keep Delta's default
        return True
    return size >= DELETION_VECTORS_FROM_BYTES


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

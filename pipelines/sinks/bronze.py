"""Bronze stage: append a flow's source records to its Delta table, exactly once.

Exactly-once comes from three real mechanisms together: the source is replayable (Kafka offsets,
or the file source's log of seen files); Structured Streaming writes the planned offsets of a
batch to the checkpoint's offset log before running it, and its commit-log entry only after the
batch's write returned; and every write carries Delta's transaction id, ``txnAppId`` (the flow's
id and checkpoint generation, :attr:`FlowIdentity.txn_app_id`) with ``txnVersion`` = the batch id.
Delta records the pair in the same commit as the rows and skips a write whose version it already
holds for that app id. A process killed after the Delta commit but before the commit-log entry
replays the batch on restart, with the same offsets and the same batch id, and Delta skips it.

Each batch first checks that this application still holds the flow's lease, with a third of its
duration to spare (:class:`~pipelines.lease.LeaseGuard`), and the runner checks it every half
second and stops the queries when it is lost; should a stale writer's batch still commit, its
transaction id makes the new owner's replay of that batch a no-op.
After the write, the batch's :class:`BatchCommit` says what Delta actually did, read from the
commit file itself: the version that carries this batch's transaction id and the rows it added
(its ``numOutputRows`` metric), or, when the write added no commit, that the batch was a replay
Delta skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipelines.identity import FlowIdentity, resolve_identity, write_identity
from pipelines.lease import LeaseGuard
from pipelines.locations import FlowLocations
from pipelines.progress import BatchCommit, delta_version
from pipelines.settings import Settings
from pipelines.sources import SourceReader, source_reader
from pipelines.spec import FlowSpec


def with_ingestion_columns(frame: DataFrame) -> DataFrame:
    """Add ``ingested_at`` (when the batch was written) and ``ingest_date``."""
    return frame.withColumn("ingested_at", F.current_timestamp()).withColumn(
        "ingest_date", F.to_date("ingested_at")
    )


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


def find_commit(
    spark: SparkSession, table_path: str, versions: range, app_id: str, batch_id: int
) -> tuple[int, int] | None:
    """(version, rows added) of the commit in ``versions`` that carries txn (app_id, batch_id)."""
    for version in versions:
        actions = commit_actions(spark, table_path, version)
        txns = [a["txn"] for a in actions if "txn" in a]
        if any(t.get("appId") == app_id and int(t.get("version", -1)) == batch_id for t in txns):
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            return version, int((info.get("operationMetrics") or {}).get("numOutputRows", 0))
    return None


class BronzeStage:
    """One flow's bronze stream: the source, written by ``foreachBatch`` with Delta txn ids."""

    def __init__(
        self,
        spec: FlowSpec,
        settings: Settings,
        guard: LeaseGuard | None,
        on_commit: Callable[[BatchCommit], None],
        reader: SourceReader | None = None,
    ) -> None:
        self.spec = spec
        self.locations = FlowLocations.of(spec, settings)
        self.reader = reader or source_reader(spec, settings)
        self.guard = guard
        self.on_commit = on_commit
        self.table_path = str(self.locations.table)
        self.identity: FlowIdentity | None = None

    def prepare(self, spark: SparkSession) -> DataFrame:
        """Check the flow's identity, create or stamp the table; return the source stream.

        Raises:
            IdentityError: the checkpoint and the table disagree (see :mod:`pipelines.identity`).
        """
        identity, stamp = resolve_identity(
            self.spec, self.locations, table_properties(spark, self.table_path)
        )
        stream = self.reader.stream(spark)
        if stamp:
            self._stamp_table(spark, identity, with_ingestion_columns(stream))
        write_identity(self.locations, identity)
        self.identity = identity
        return stream

    def _stamp_table(self, spark: SparkSession, identity: FlowIdentity, shape: DataFrame) -> None:
        """Create the table with the identity properties, or set them on an existing table."""
        properties = identity.table_properties()
        if DeltaTable.isDeltaTable(spark, self.table_path):
            assignments = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
            spark.sql(f"ALTER TABLE delta.`{self.table_path}` SET TBLPROPERTIES ({assignments})")
            return
        builder = DeltaTable.createIfNotExists(spark).location(self.table_path)
        builder = builder.addColumns(shape.schema)
        if self.spec.target.partition_by:
            builder = builder.partitionedBy(*self.spec.target.partition_by)
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()

    def start(self, spark: SparkSession, trigger_mode: str | None = None) -> StreamingQuery:
        """Start the flow's query; ``trigger_mode`` overrides the spec's trigger mode."""
        stream = self.prepare(spark)
        self.locations.checkpoint.mkdir(parents=True, exist_ok=True)
        writer = (
            stream.writeStream.queryName(self.spec.name)
            .option("checkpointLocation", str(self.locations.checkpoint))
            .foreachBatch(self.write_batch)
        )
        if (trigger_mode or self.spec.trigger.mode) == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.spec.trigger.interval)
        return writer.start()

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch idempotently; runs in the driver for every batch."""
        assert self.identity is not None, "prepare() runs before the query starts"
        if self.guard is not None:
            self.guard.check()  # LeaseLostError fails the query before anything is written
        spark = batch.sparkSession
        before = delta_version(spark, self.table_path)
        frame = with_ingestion_columns(self.reader.prepare_batch(batch))
        app_id = self.identity.txn_app_id
        writer = (
            frame.write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", str(batch_id))
        )
        if self.spec.target.partition_by:
            writer = writer.partitionBy(*self.spec.target.partition_by)
        writer.save(self.table_path)
        after = delta_version(spark, self.table_path)
        # Versions committed by this write, if any: a replay Delta skipped adds none, even when
        # the newest commit is that very batch's first attempt.
        new_versions = range((-1 if before is None else before) + 1, (after or 0) + 1)
        found = find_commit(spark, self.table_path, new_versions, app_id, batch_id)
        version, rows = found if found is not None else (None, 0)
        self.on_commit(BatchCommit(self.spec.name, batch_id, version, rows, found is None))

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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.catalog.roles import BRONZE_STAGE, TableRole, role_id
from pipelines.catalog.state import FlowState
from pipelines.delta_writes import (
    BACKGROUND_CHECKPOINT_PROPERTIES,
    TableWrite,
    append_idempotently,
    table_properties,
)
from pipelines.identity import FlowIdentity, resolve_identity, write_identity
from pipelines.lease import LeaseGuard
from pipelines.location import Location
from pipelines.progress import BatchCommit
from pipelines.settings import Settings
from pipelines.sources import SourceReader, source_reader
from pipelines.spec import FlowSpec

if TYPE_CHECKING:
    from pipelines.stages import Stage


def with_ingestion_columns(frame: DataFrame) -> DataFrame:
    """Add ``ingested_at`` (when the batch was written) and ``ingest_date``."""
    return frame.withColumn("ingested_at", F.current_timestamp()).withColumn(
        "ingest_date", F.to_date("ingested_at")
    )


class BronzeStage:
    """One flow's bronze stream: the source, written by ``foreachBatch`` with Delta txn ids."""

    kind = BRONZE_STAGE
    output_mode = "append"
    own_query = True

    reads_flows: tuple[str, ...] = ()

    def __init__(
        self,
        spec: FlowSpec,
        settings: Settings,
        guard: LeaseGuard | None,
        on_commit: Callable[[BatchCommit], None],
        reader: SourceReader | None = None,
    ) -> None:
        self.spec = spec
        self.locations = FlowState.of(spec, settings)
        self.reader = reader or source_reader(spec, settings)
        self.guard = guard
        self.on_commit = on_commit
        self.table_path = str(self.locations.table)
        self.query_name = spec.name
        self.tables = {role_id(TableRole.BRONZE): (spec.target.table, self.table_path)}
        self.main_table = self.table_path
        self.checkpoint: Location = self.locations.checkpoint
        self.identity: FlowIdentity | None = None
        self._stream: DataFrame | None = None

    def prepare(self, spark: SparkSession) -> None:
        """Check the flow's identity, create or stamp the table.

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
        self._stream = stream

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """The source's stream (what :meth:`prepare` opened)."""
        return self._stream if self._stream is not None else self.reader.stream(spark)

    def _stamp_table(self, spark: SparkSession, identity: FlowIdentity, shape: DataFrame) -> None:
        """Create the table with the identity properties, or set them on an existing table."""
        properties = identity.table_properties()
        if DeltaTable.isDeltaTable(spark, self.table_path):  # an older table: checkpoints as it was
            assignments = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
            spark.sql(f"ALTER TABLE delta.`{self.table_path}` SET TBLPROPERTIES ({assignments})")
            return
        builder = DeltaTable.createIfNotExists(spark).location(self.table_path)
        builder = builder.addColumns(shape.schema)
        if self.spec.target.partition_by:
            builder = builder.partitionedBy(*self.spec.target.partition_by)
        for key, value in {**properties, **BACKGROUND_CHECKPOINT_PROPERTIES}.items():
            builder = builder.property(key, value)
        builder.execute()

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        """Nothing to do after a run: bronze writes only in its batches."""
        return []

    def rows(self, batch: DataFrame) -> DataFrame:
        """The rows bronze writes for a micro-batch of the source (what later stages read)."""
        return with_ingestion_columns(self.reader.prepare_batch(batch))

    def write_batch(self, batch: DataFrame, batch_id: int) -> BatchCommit:
        """Write one micro-batch idempotently; runs in the driver for every batch."""
        self._check_lease()
        return self.write_rows(self.rows(batch), batch_id)

    def starting(self, trigger_mode: str) -> None:
        """Bronze needs no word of the others."""

    def write_with(self, batch: DataFrame, batch_id: int, fused: Sequence[Stage]) -> None:
        """Write the stages fused into bronze, then bronze, on the very same rows (one ingestion
        time for bronze and what follows), all under the batch's id.

        Bronze's append comes last: the fused stages read the batch's rows, not the bronze table,
        and their current-state table is what readers wait for, so it commits ~1 s sooner in
        every batch (bench/HISTORY.md, "Silver freshness, eleventh session"). Exactly once does not
        depend on the order: every write carries the batch's transaction id, so a batch run again
        after a crash writes only what had not committed, bronze's rows included. The lease is
        checked once, before anything of the batch is written."""
        if not fused:
            self.write_batch(batch, batch_id)
            return
        rows = self.rows(batch).persist()
        try:
            self._check_lease()
            for stage in fused:
                stage.write_batch(rows, batch_id)
            self.write_rows(rows, batch_id)
        finally:
            rows.unpersist()

    def _check_lease(self) -> None:
        if self.guard is not None:
            self.guard.check()  # LeaseLostError fails the query before anything is written

    def write_rows(self, rows: DataFrame, batch_id: int) -> BatchCommit:
        """Append bronze rows (see :meth:`rows`) under the batch's transaction id; the caller
        checked the lease before the batch's first write."""
        assert self.identity is not None, "prepare() runs before the query starts"
        write = append_idempotently(
            rows,
            self.spec.target.table,
            role_id(TableRole.BRONZE),
            self.table_path,
            self.identity.txn_app_id,
            batch_id,
            self.spec.target.partition_by,
        )
        commit = BatchCommit(
            self.spec.name, batch_id, write.version, write.rows, write.skipped, writes=(write,)
        )
        self.on_commit(commit)
        return commit

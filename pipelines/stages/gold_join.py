"""Gold joins: a stream-stream join of two silver events tables, late rows of both sides captured.

A gold table with ``join:`` runs as two streaming queries, like windowed aggregates
(:mod:`pipelines.stages.gold`):

1. **the split** (:class:`JoinSplitStage`) reads this flow's events (the left side) and the
   right side's events (this flow's or another flow's, as a Delta stream in this application)
   in one query, and sorts each micro-batch's rows by Conflux's watermark over both sides
   (:mod:`pipelines.gold.joins`): quarantined (null or future event time), late (to the late-data
   table, with its side and the watermark at arrival) or on time (to the input table, one table
   for both sides).
2. **the join** (:class:`JoinStage`) reads the input table as one Delta stream (whole versions),
   joins its left rows with its right rows on the keys within the time bound, with Spark's
   watermark on both sides (RocksDB state), and appends the joined rows to the gold table
   (partitioned by the left row's event date) under the batch's transaction id.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from pipelines.delta_writes import TableWrite, append_idempotently
from pipelines.gold.joins import LEFT, RIGHT, join_rows, late_condition, side_of, side_rows
from pipelines.locations import table_paths
from pipelines.progress import BatchCommit
from pipelines.spec import GoldJoinSpec, duration_seconds, join_input
from pipelines.stages.gold import COORDINATES, SplitStage, _GoldBase, whole_versions


class _JoinInput(_GoldBase):
    gold: GoldJoinSpec

    def _own_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        other = join_input(self.spec, self.gold)
        self.right_events_path = str(table_paths(other, self.settings)["events"])
        self.reads_flows = () if other.name == self.spec.name else (other.name,)
        return self._join_tables()

    def _join_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        raise NotImplementedError

    def _input_schema(self, spark: SparkSession) -> StructType:
        """``_side``, ``_event_time``, the two sides' structs, the coordinates (see
        :mod:`pipelines.gold.joins`)."""
        gold = self.gold
        paths = {LEFT: self.events_path, RIGHT: self.right_events_path}
        events = {
            side: self._events_schema(
                spark,
                paths[side],
                gold.side_columns(side),
                side_of(gold, side).event_time,
                f" ({side} side, {paths[side]})",
            )
            for side in (LEFT, RIGHT)
        }
        return StructType(
            [
                StructField("_side", StringType()),
                StructField("_event_time", TimestampType()),
                *(
                    StructField(f"_{side}", StructType([events[side][c] for c in columns]))
                    for side in (LEFT, RIGHT)
                    for columns in [gold.side_columns(side)]
                ),
                *(events[LEFT][c] for c in COORDINATES),
            ]
        )


class JoinSplitStage(_JoinInput, SplitStage):
    """The split query of a gold join (see the module doc)."""

    sides = (LEFT, RIGHT)

    def _join_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        return SplitStage._own_tables(self)

    def prepare(self, spark: SparkSession) -> None:
        self.schema = self._input_schema(spark)
        self._prepare_split(spark, self.schema, "")

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """Both sides' events, whole versions per batch, as input rows."""
        left = side_rows(whole_versions(spark, self.events_path), self.gold, LEFT, self.schema)
        right = side_rows(
            whole_versions(spark, self.right_events_path), self.gold, RIGHT, self.schema
        )
        return left.unionByName(right)

    def _side(self) -> Column:
        return F.col("_side")

    def _late(self, watermark_micros: int | None) -> Column:
        return late_condition(watermark_micros)

    def _late_columns(self) -> list[Column]:
        return []

    def _event_time_name(self) -> Column:
        join = self.gold.join
        right = f"{join.right.event_time} (right side, flow {join.right_flow(self.spec.name)})"
        return F.when(
            F.col("_side") == LEFT, F.lit(f"{join.left.event_time} (left side)")
        ).otherwise(F.lit(right))


class JoinStage(_JoinInput):
    """The stateful query of a gold join (see the module doc)."""

    def _join_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        return self._gold_tables()

    def prepare(self, spark: SparkSession) -> None:
        empty = spark.createDataFrame([], self._input_schema(spark))
        self._prepare_gold(spark, join_rows(empty, self.gold).schema)

    def input_stream(self, spark: SparkSession) -> DataFrame:
        lateness = f"{duration_seconds(self.gold.allowed_lateness)} seconds"
        return join_rows(whole_versions(spark, self.input_path), self.gold, lateness)

    def write_batch(self, joined: DataFrame, batch_id: int) -> BatchCommit:
        if self.guard is not None:
            self.guard.check()
        joined = joined.persist()  # the stateful plan runs once
        try:
            writes: list[TableWrite] = []
            if joined.count():
                writes.append(
                    append_idempotently(
                        joined,
                        self.gold.table,
                        f"gold/{self.gold.table}",
                        self.gold_path,
                        self.app_id(self.gold.table),
                        batch_id,
                        ("_event_date",),
                    )
                )
        finally:
            joined.unpersist()
        return self._committed(batch_id, writes)

"""Gold joins: a stream-stream join of two silver events tables, late rows of both sides captured.

A gold table with ``join:`` runs as two streaming queries, like windowed aggregates
(:mod:`pipelines.stages.gold`):

1. **the split** (:class:`JoinSplitStage`) reads this flow's events (the left side) and the
   right side's events (this flow's or another flow's, as a Delta stream in this application)
   in one query, and sorts each micro-batch's rows by Conflux's watermark over both sides
   (:mod:`pipelines.gold.joins`): quarantined (null or future event time), late (to the late-data
   table, with its side, its side's silver row whole and the watermark at arrival) or on time
   (to the input table, one table for both sides).
2. **the join** (:class:`JoinStage`) reads the input table as a Delta stream (whole versions;
   Spark plans the self-join as two sources of it), joins its left rows with its right rows on the keys within the time bound, with Spark's
   watermark on both sides (RocksDB state), and appends the joined rows to the gold table
   (partitioned by the left row's event date) under the batch's transaction id.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.catalog.roles import TableRole
from pipelines.catalog.tables import FlowCatalog
from pipelines.delta_writes import TableWrite
from pipelines.errors import ConfigError
from pipelines.gold.joins import (
    LEFT,
    RIGHT,
    common_watermarks,
    input_schema,
    join_rows,
    side_of,
    side_row_types,
    side_rows,
    side_watermarks,
)
from pipelines.gold.watermark import WatermarkRecord, micros_column, micros_to_iso
from pipelines.gold.windows import future_condition
from pipelines.progress import BatchCommit
from pipelines.spec import GoldJoinSpec, duration_seconds, join_input
from pipelines.stages.gold import SplitStage, _GoldBase, whole_versions


class _JoinInput(_GoldBase):
    gold: GoldJoinSpec

    def _own_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        other = join_input(self.spec, self.gold)
        self.right_events_path = (
            FlowCatalog.of(other, self.settings).table(TableRole.EVENTS).location
        )
        self.reads_flows = () if other.name == self.spec.name else (other.name,)
        return self._join_tables()

    def _join_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        raise NotImplementedError

    def _input_schema(self, spark: SparkSession) -> StructType:
        """``_side``, ``_event_time``, the two sides' structs, the coordinates (see
        :mod:`pipelines.gold.joins`)."""
        return input_schema(self.gold, self._side_events(spark))

    def _side_events(self, spark: SparkSession) -> dict[str, StructType]:
        """Both sides' events schemas, checked: the columns exist, the keys have one type."""
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
        for key in gold.join.keys:
            types = {side: events[side][key].dataType.simpleString() for side in (LEFT, RIGHT)}
            if types[LEFT] != types[RIGHT]:
                raise ConfigError(
                    f"{self.spec.spec_file}: gold ({gold.table}): join key {key!r} is "
                    f"{types[LEFT]} on the left and {types[RIGHT]} on the right; keys must have "
                    "one type (cast one side in its flow's silver schema)"
                )
        return events


class JoinSplitStage(_JoinInput, SplitStage):
    """The split query of a gold join (see the module doc)."""

    sides = (LEFT, RIGHT)
    #: Whether the join query runs at the same time as this one (a continuous run starts both
    #: together; set by :meth:`starting`).
    beside_join = False

    def starting(self, trigger_mode: str) -> None:
        """An ``available_now`` run starts the join query after this one ended; any other runs
        them side by side, and the split then judges lateness with a margin (module doc)."""
        self.beside_join = trigger_mode != "available_now"

    def _join_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        return SplitStage._own_tables(self)

    def prepare(self, spark: SparkSession) -> None:
        events = self._side_events(spark)
        self.schema = input_schema(self.gold, events)
        self._prepare_split(spark, self.schema, (), side_row_types(self.gold, events))

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """Both sides' events, whole versions per batch, as input rows."""
        # the application's session, whose query manager lists the join query (a micro-batch's
        # DataFrame has a cloned session of its own)
        self.session = spark
        paths = {LEFT: self.events_path, RIGHT: self.right_events_path}
        left, right = (
            side_rows(whole_versions(spark, paths[side]), self.gold, side, self.schema, mark=True,
                      whole=self.whole)  # the late table's rows whole
            for side in (LEFT, RIGHT)
        )  # fmt: skip
        return left.unionByName(right)

    def _filtered(self) -> Column:
        return F.col("_gold_filtered")

    def _source_flow(self) -> Column:
        right = self.gold.join.right_flow(self.spec.name)
        return F.when(F.col("_side") == LEFT, F.lit(self.spec.name)).otherwise(F.lit(right))

    def _side(self) -> Column:
        return F.col("_side")

    def _row_watermark(
        self, batch_id: int, record: WatermarkRecord | None, rows: DataFrame
    ) -> tuple[Column, dict[str, Any]]:
        """Each side's watermark: :func:`pipelines.gold.joins.common_watermarks`, or, when the
        join query runs beside this one, :func:`pipelines.gold.joins.side_watermarks` (from the
        sides' maxima before the batch and the batch's own); the choice recorded per batch."""
        before = record.max_by_side if record is not None else {}
        lateness = duration_seconds(self.gold.allowed_lateness) * 1_000_000
        join_query = f"{self.spec.name}.gold.{self.gold.table}"
        decision = self.watermarks.decision(
            batch_id,
            lambda: {
                "join_running": self.beside_join
                or any(q.name == join_query for q in self.session.streams.active)
            },
        )
        if decision["join_running"]:
            watermarks = side_watermarks(before, self._batch_maxima(rows), lateness)
        else:
            watermarks = common_watermarks(before, lateness)
        column = F.when(F.col("_side") == LEFT, micros_column(watermarks[LEFT])).otherwise(
            micros_column(watermarks[RIGHT])
        )
        return column, {
            "watermark": micros_to_iso(record.watermark_micros if record else None),
            **{f"watermark_{side}": micros_to_iso(watermarks[side]) for side in self.sides},
            "join_running": bool(decision["join_running"]),
        }

    def _batch_maxima(self, rows: DataFrame) -> dict[str, int | None]:
        """The greatest event time of each side among the batch's rows the split judges."""
        future = future_condition(
            F.col("_event_time"), F.col("_ingested_at"), self.gold.max_future_skew
        )
        # as row_class judges them: not filtered, a time, not in the future (unknown: not)
        judged = ~F.col("_gold_filtered") & ~F.coalesce(future, F.lit(False))
        maxima = rows.agg(
            *(
                F.max(
                    F.when(judged & (F.col("_side") == side), F.unix_micros("_event_time"))
                ).alias(side)
                for side in self.sides
            )
        ).first()
        assert maxima is not None
        return maxima.asDict()

    def _late(self, watermark: Column) -> Column:
        return F.col("_event_time") <= watermark

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
                writes.append(self._append(joined, self.gold_entry, batch_id))
        finally:
            joined.unpersist()
        return self._committed(batch_id, writes)

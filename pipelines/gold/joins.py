"""Event-time rules of a gold join: its input rows, the join itself, and which rows are late.

A join's split query (:class:`pipelines.stages.gold_join.JoinSplitStage`) reads both sides' silver
events into one **input table**: a row is ``_side`` (left or right), its ``_event_time``, the
side's columns in a struct (``_left`` or ``_right``, the other one null) and its coordinates.
The stateful query reads that one table as one Delta stream and joins it with itself, so both
sides of every micro-batch come from the same table versions; a backfill applies the very same
:func:`join_rows` to a batch of both sides' events.

**Which rows are late.** Spark's stream-stream join drops an input row of either side when its
event time is not above the global watermark (the least of the two sides' watermarks, of the
batch before), counting it in ``numRowsDroppedByWatermark`` (measured on Spark 4.1.3). The split
uses that very rule against Conflux's watermark: the least over both sides of ``max(event time of
the side's earlier split batches) - allowed_lateness``, none until both sides had a row. Spark's
watermarks see only rows the split already let through, so its global watermark is never above
Conflux's, and every row it would drop was captured in the late-data table first.

**When output appears.** A pair is written in the micro-batch that brings its second row. With
``left_outer``, a left row without a match is written (right columns null, ``_matched`` false) once
the watermark passes its time bound (event time + ``within.after``): Spark evicts it from the
join's state then, in a batch of its own when no data comes (a no-data batch).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.spec import GoldJoinSpec, JoinSide, duration_seconds

#: ``_side`` of an input row.
LEFT, RIGHT = "left", "right"
#: The right side's key columns inside the joined rows, until the join's output drops them.
_RIGHT_KEY = "_right_key_"


def side_of(gold: GoldJoinSpec, side: str) -> JoinSide:
    return gold.join.left if side == LEFT else gold.join.right


def side_rows(events: DataFrame, gold: GoldJoinSpec, side: str, schema: StructType) -> DataFrame:
    """One side's events as input rows of ``schema`` (the input table's): the side's ``where``
    applied, its columns in its struct, its event time as ``_event_time``."""
    chosen = side_of(gold, side)
    if chosen.where:
        events = events.where(F.expr(chosen.where))
    own = F.struct(*(F.col(c) for c in gold.side_columns(side)))
    columns = {
        "_side": F.lit(side),
        "_event_time": F.col(chosen.event_time),
        "_left": own if side == LEFT else F.lit(None),
        "_right": own if side == RIGHT else F.lit(None),
    }
    return events.select(
        *(
            columns.get(field.name, F.col(field.name)).cast(field.dataType).alias(field.name)
            for field in schema.fields
        )
    )


def late_condition(watermark_micros: int | None) -> Column:
    """A row of either side is late when its event time is not above the watermark (None: no
    watermark yet, nothing is late)."""
    if watermark_micros is None:
        return F.lit(False)
    return F.col("_event_time") <= F.timestamp_micros(F.lit(watermark_micros))


def is_late(event_micros: int, watermark_micros: int | None) -> bool:
    """Plain-Python twin of :func:`late_condition`."""
    return watermark_micros is not None and event_micros <= watermark_micros


def join_rows(rows: DataFrame, gold: GoldJoinSpec, lateness: str | None = None) -> DataFrame:
    """The joined table's rows from input rows (a stream, with ``lateness`` the watermark delay
    of both sides; or a batch)."""
    join = gold.join
    keys = join.keys
    left_columns = [c for c in join.left.columns if join.left.prefix + c not in keys]
    right_columns = [c for c in join.right.columns if join.right.prefix + c not in keys]
    left = rows.where(F.col("_side") == LEFT).select(
        *(F.col(f"_left.{k}").alias(k) for k in keys),
        *(F.col(f"_left.{c}").alias(join.left.prefix + c) for c in left_columns),
        F.col("_event_time").alias("_left_time"),
    )
    right = rows.where(F.col("_side") == RIGHT).select(
        *(F.col(f"_right.{k}").alias(_RIGHT_KEY + k) for k in keys),
        *(F.col(f"_right.{c}").alias(join.right.prefix + c) for c in right_columns),
        F.col("_event_time").alias("_right_time"),
    )
    if lateness is not None:
        left = left.withWatermark("_left_time", lateness)
        right = right.withWatermark("_right_time", lateness)
    before = duration_seconds(join.within.before)
    after = duration_seconds(join.within.after)
    condition = F.expr(
        " AND ".join(
            [
                *(f"`{k}` = `{_RIGHT_KEY}{k}`" for k in keys),
                f"_right_time >= _left_time - INTERVAL {before} SECONDS",
                f"_right_time <= _left_time + INTERVAL {after} SECONDS",
            ]
        )
    )
    joined = left.join(right, condition, "inner" if join.how == "inner" else "left_outer")
    return joined.select(
        *(F.col(k) for k in keys),
        *(F.col(join.left.prefix + c) for c in left_columns),
        *(F.col(join.right.prefix + c) for c in right_columns),
        F.col("_left_time"),
        F.col("_right_time"),
        F.col("_right_time").isNotNull().alias("_matched"),
        F.to_date("_left_time").alias("_event_date"),
        F.current_timestamp().alias("_joined_at"),
    )


def right_time_range(gold: GoldJoinSpec, first: date, last: date) -> tuple[datetime, datetime]:
    """``[low, high)``: the right rows that can join a left row of the dates ``first..last``."""
    within = gold.join.within
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    return (
        start - timedelta(seconds=duration_seconds(within.before)),
        end + timedelta(seconds=duration_seconds(within.after)),
    )


def covered_condition(gold: GoldJoinSpec, first: date, last: date) -> Column:
    """Whether a backfill of ``first..last`` covers a late row: a left row of one of the dates;
    a right row whose possible partners' dates all are among them."""
    within = gold.join.within
    time = F.col("_event_time")
    earliest = F.to_date(time - F.expr(f"INTERVAL {duration_seconds(within.after)} SECONDS"))
    latest = F.to_date(time + F.expr(f"INTERVAL {duration_seconds(within.before)} SECONDS"))
    in_range = F.col("_event_date").between(F.lit(first), F.lit(last))
    return F.when(F.col("_side") == LEFT, in_range).otherwise(
        (earliest >= F.lit(first)) & (latest <= F.lit(last))
    )

"""Event-time rules of a gold join: its input rows, the join itself, and which rows are late.

A join's split query (:class:`pipelines.stages.gold_join.JoinSplitStage`) reads both sides' silver
events into one **input table**: a row is ``_side`` (left or right), its ``_event_time``, the
side's columns in a struct (``_left`` or ``_right``, the other one null) and its coordinates;
each split batch appends its on-time rows of both sides in one commit (a late row goes to the late
table with its side's silver row whole in ``_left`` or ``_right``: :func:`side_row_types`). The
stateful query reads that table as a Delta stream and joins its left rows with its right rows; a
backfill applies the very same :func:`join_rows` to a batch of both sides' events.

**Which rows are late.** Spark's stream-stream join drops an input row of either side when its
event time is not above the global watermark (the least of the two sides' watermarks, of the
batch before), counting it in ``numRowsDroppedByWatermark`` (measured on Spark 4.1.3). A side's
Spark watermark is ``max(event time of the side's rows the join has read) - allowed_lateness``.
The split judges a row of split batch ``m`` by Conflux's watermark ``W = min over both sides of
(the side's max of batches < m) - allowed_lateness`` (the epoch until both sides had a row),
which is the join's watermark when each join batch reads one split commit (a join batch that
reads several judges them by an older watermark, and Spark keeps milliseconds: both only make
Spark drop fewer): so the late rows are the rows the join would drop (the ``gold_join``
benchmark checks captured = dropped). That holds when the join does not plan while the split
commits (an ``available_now`` run: the join starts once the split has ended).

When both queries run at once, one more case: Spark plans the self-join of the input table as
two sources of one table, each taking its own end version, so one branch can read a split commit
one batch before the other and push its side's watermark ahead by that commit's rows. A split
batch of a run where the join query runs beside it therefore judges a row of side T by
``min(T's max of batches < m, the other side's max of batches <= m) - allowed_lateness``
(:func:`side_watermarks`), never below the join's watermark even then; the price is that rows
just above ``W`` may be captured although the join would still have taken them (a backfill puts
them in). The choice is recorded per batch before it writes (a replay splits as its first attempt
did). Two split commits within the milliseconds between the two sources' planning would exceed
that margin; split batches are seconds apart, and the gold check ``watermark_drops`` shows it.

**When output appears.** A pair is written in the micro-batch that brings its second row. With
``left_outer``, a left row without a match is written (right columns null, ``_matched`` false) once
the watermark passes its time bound (event time + ``within.after``): Spark evicts it from the
join's state then, in a batch of its own when no data comes (a no-data batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from pipelines.gold import COORDINATES
from pipelines.gold.late import whole_row, whole_row_column, whole_row_type
from pipelines.spec import GoldJoinSpec, JoinSide, duration_seconds

#: ``_side`` of an input row.
LEFT, RIGHT = "left", "right"
#: The right side's key columns inside the joined rows, until the join's output drops them.
_RIGHT_KEY = "_right_key_"


def side_of(gold: GoldJoinSpec, side: str) -> JoinSide:
    return gold.join.left if side == LEFT else gold.join.right


def input_schema(gold: GoldJoinSpec, events: Mapping[str, StructType]) -> StructType:
    """The input table's columns, from both sides' events schemas: ``_side``, ``_event_time``,
    each side's columns in its struct, then the row's coordinates (the left side's types)."""
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


def side_row_types(gold: GoldJoinSpec, events: Mapping[str, StructType]) -> dict[str, StructType]:
    """The late table's ``_left`` and ``_right``: every column of the side's events, the side's
    columns of the input table's struct first (so an older late table's struct grows into it)."""
    return {
        f"_{side}": whole_row_type(events[side], gold.side_columns(side)) for side in (LEFT, RIGHT)
    }


def side_rows(
    events: DataFrame, gold: GoldJoinSpec, side: str, schema: StructType, mark: bool = False,
    whole: Mapping[str, StructType] | None = None,
) -> DataFrame:  # fmt: skip
    """One side's events as input rows of ``schema`` (the input table's): its columns in its
    struct, its event time as ``_event_time``; the rows the side's ``where`` leaves out dropped,
    or with ``mark`` kept and marked in ``_gold_filtered`` (the split counts them). ``whole``
    (the split's: the late table's :func:`side_row_types`): the side's row whole too, in the
    split's carrying column of its side's struct (the other side's null)."""
    chosen = side_of(gold, side)
    wanted = F.coalesce(F.expr(chosen.where), F.lit(False)) if chosen.where else F.lit(True)
    if not mark:
        events = events.where(wanted)
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
        ),
        *([(~wanted).alias("_gold_filtered")] if mark else []),
        *(
            (whole_row(row_type) if name == f"_{side}" else F.lit(None).cast(row_type)).alias(
                whole_row_column(name)
            )
            for name, row_type in (whole or {}).items()
        ),
    )


def side_watermarks(
    before: Mapping[str, int | None], batch: Mapping[str, int | None], lateness_micros: int
) -> dict[str, int]:
    """The watermark the rows of each side of a split batch are judged by (see the module doc):
    ``min(the side's max before the batch, the other side's max including the batch) -
    lateness``; the epoch (0) while either is unknown, where Spark's watermark stands then."""

    def known_max(*values: int | None) -> int | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    watermarks = {}
    for side, other in ((LEFT, RIGHT), (RIGHT, LEFT)):
        own, others = before.get(side), known_max(before.get(other), batch.get(other))
        watermarks[side] = (
            0 if own is None or others is None else min(own, others) - lateness_micros
        )
    return watermarks


def common_watermarks(before: Mapping[str, int | None], lateness_micros: int) -> dict[str, int]:
    """Both sides' watermark when the join does not run beside the split: ``min over both sides
    of (the side's max before the batch) - lateness``; the epoch (0) until both had a row."""
    known = [before.get(side) for side in (LEFT, RIGHT)]
    watermark = 0
    if all(m is not None for m in known):
        watermark = min(m for m in known if m is not None) - lateness_micros
    return {LEFT: watermark, RIGHT: watermark}


def is_late(event_micros: int, watermark_micros: int) -> bool:
    """Plain Python: a row of either side is late when its event time is not above the watermark
    its side is judged by (:func:`common_watermarks` or :func:`side_watermarks`)."""
    return event_micros <= watermark_micros


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

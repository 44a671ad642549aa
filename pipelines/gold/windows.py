"""Event-time rules of a gold stage, as Spark Columns and as plain Python (for tests and docs).

Windows start at multiples of their slide from the Unix epoch, as Spark's ``window()`` places
them; a window holds the event times ``start <= t < end``.

**Which rows are late.** Spark's stateful operators drop an input row when the state it would
change is already closed under the batch's watermark: a windowed aggregation drops a (row,
window) pair when ``window.end <= watermark``; ``dropDuplicatesWithinWatermark`` drops a row when
``event_time <= watermark``. Conflux splits rows off *before* the stateful query, against its own
watermark, which is never lower than Spark's (see :mod:`pipelines.stages.gold`), with the same
predicates:

* without deduplication, a row is late when the *earliest* window that holds it has ended, i.e.
  the next slide boundary after its event time is not above the watermark. With tumbling windows
  that is its one window; with sliding windows the row is kept whole out of gold (not counted in
  its windows that are still open either) until a backfill recomputes its dates, so a gold row is
  never a partial count of a row;
* with deduplication, a row is late when its event time is not above the watermark.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipelines.spec import GoldSpec, duration_seconds

MICROS = 1_000_000
#: The table property recording a gold table's :func:`design_key`.
GOLD_PROPERTY = "conflux.gold.design"
#: ``_gold_class`` of a row of a split batch.
ON_TIME, LATE, NULL_TIME, FUTURE_TIME = "on_time", "late", "null_event_time", "future_event_time"
#: ``_gold_class`` of a row a join side's ``where`` leaves out.
FILTERED = "filtered"


def earliest_window_end_micros(event_micros: int, slide_seconds: int) -> int:
    """The end of the first window holding ``event_micros``: the next slide boundary after it."""
    slide = slide_seconds * MICROS
    return event_micros - event_micros % slide + slide


def is_late(
    event_micros: int, watermark_micros: int | None, slide_seconds: int, deduplicate: bool
) -> bool:
    """Plain-Python twin of :func:`late_condition`."""
    if watermark_micros is None:
        return False
    if deduplicate:
        return event_micros <= watermark_micros
    return earliest_window_end_micros(event_micros, slide_seconds) <= watermark_micros


def earliest_window_end(event_time: Column, gold: GoldSpec) -> Column:
    """The end (a timestamp) of the first window holding ``event_time``."""
    slide = gold.window.slide_seconds * MICROS
    micros = F.unix_micros(event_time)
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(slide)) + F.lit(slide))


def late_condition(event_time: Column, watermark: Column, gold: GoldSpec) -> Column:
    """Whether a row with ``event_time`` is late under ``watermark`` (a timestamp Column; null:
    no watermark yet, nothing is late)."""
    if gold.deduplicate:
        late = event_time <= watermark
    else:
        late = earliest_window_end(event_time, gold) <= watermark
    return F.coalesce(late, F.lit(False))


def future_condition(event_time: Column, ingested_at: Column, max_future_skew: str) -> Column:
    """An event time beyond its ingestion time plus ``max_future_skew``: a wrong clock, not an
    event from the future. Compared with the row's ingestion time, not the current time, so a
    batch replayed after a crash is split the same way."""
    skew = duration_seconds(max_future_skew) * MICROS
    return F.unix_micros(event_time) > F.unix_micros(ingested_at) + F.lit(skew)


def row_class(
    event_time: Column, ingested_at: Column, late: Column, max_future_skew: str
) -> Column:
    """``_gold_class``: quarantined (null or future event time), late (by the stage's ``late``
    condition), or on time."""
    return (
        F.when(event_time.isNull(), F.lit(NULL_TIME))
        .when(future_condition(event_time, ingested_at, max_future_skew), F.lit(FUTURE_TIME))
        .when(late, F.lit(LATE))
        .otherwise(F.lit(ON_TIME))
    )


def window_column(event_time: Column, gold: GoldSpec) -> Column:
    """Spark's ``window()`` over the event time, as the spec declares it."""
    if gold.window.slide is None:
        return F.window(event_time, gold.window.duration)
    return F.window(event_time, gold.window.duration, gold.window.slide)


def aggregate_columns(gold: GoldSpec) -> list[Column]:
    """The gold table's aggregates, then ``_rows`` (the rows each gold row reflects)."""
    functions = {
        "sum": F.sum,
        "min": F.min,
        "max": F.max,
        "avg": F.avg,
        "approx_count_distinct": F.approx_count_distinct,
    }
    columns = []
    for aggregate in gold.aggregates:
        if aggregate.function == "count":
            target = F.col(aggregate.column) if aggregate.column else F.lit(1)
            columns.append(F.count(target).alias(aggregate.name))
        else:
            assert aggregate.column is not None, "validated: the function needs a column"
            columns.append(functions[aggregate.function](aggregate.column).alias(aggregate.name))
    return [*columns, F.count(F.lit(1)).alias("_rows")]


def gold_columns(gold: GoldSpec) -> list[Column]:
    """The gold table's columns from an aggregation grouped by ``window`` and the group keys."""
    return [
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *(F.col(c) for c in gold.group_by),
        *(F.col(a.name) for a in gold.aggregates),
        F.col("_rows"),
        F.to_date(F.col("window.start")).alias("_event_date"),
        F.current_timestamp().alias("_updated_at"),
    ]


def last_window_start(event_time: Column, gold: GoldSpec) -> Column:
    """The start of the last window holding ``event_time`` (the slide boundary at or before it)."""
    slide = gold.window.slide_seconds * MICROS
    micros = F.unix_micros(event_time)
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(slide)))

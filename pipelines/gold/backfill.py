"""Backfills of a gold table: event dates recomputed from the silver events, late rows included.

Gold is partitioned by the date of each window's start (``_event_date``). A backfill of the dates
``first..last`` reads the silver events that can fall in their windows, applies the stream's own
rules (a null event time or one beyond ``max_future_skew`` is left out, as the split quarantines
it; ``deduplicate`` keeps one event per key), aggregates them with Spark's ``window()`` exactly as
the stream does, and replaces those dates of the gold table in one commit (``replaceWhere``):
idempotent, so running it twice changes nothing, and one Spark job covers the whole range.

**Only closed dates.** A date can be backfilled once every window starting on it has closed under
the watermark of the stateful query's last committed batch (``batchWatermarkMs`` of its offset log):
the stream never changes a closed window again (the split sends it no rows, and Spark would drop
any), so the backfilled rows stay. A date still open is refused with the date it closes at.

**Reconciliation is append-only.** The late rows whose missed window starts on a backfilled date
are recorded in ``<gold>__backfills`` (one row per late row and backfill: its coordinates, the
backfill's id and time); the late-data table itself is never updated. Late rows not yet covered
are the late table's rows without a record there (:func:`unreconciled`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.catalog.roles import TableRole
from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import FlowCatalog
from pipelines.delta_writes import retry_on_maintenance, table_properties
from pipelines.errors import ConfigError
from pipelines.gold.joins import (
    LEFT,
    RIGHT,
    covered_condition,
    input_schema,
    join_rows,
    right_time_range,
    side_of,
    side_rows,
)
from pipelines.gold.windows import (
    GOLD_PROPERTY,
    MICROS,
    aggregate_columns,
    future_condition,
    gold_columns,
    last_window_start,
    window_column,
)
from pipelines.identity import FLOW_ID_PROPERTY, read_identity
from pipelines.location import Location
from pipelines.progress import delta_version
from pipelines.settings import Settings
from pipelines.spec import AnyGold, FlowSpec, GoldJoinSpec, GoldSpec, duration_seconds, join_input

#: What identifies a late row (its event's place in the source).
LATE_ROW_ID = ("_source_topic", "_source_partition", "_source_offset")


def late_row_id(gold: AnyGold) -> tuple[str, ...]:
    """What identifies a late row of ``gold``: its event's place, and for a join its side (one
    event is a row of both sides when a flow joins its own events)."""
    return (*LATE_ROW_ID, "_side") if isinstance(gold, GoldJoinSpec) else LATE_ROW_ID


class BackfillRefusedError(ConfigError):
    """A date of the range is still open, or the gold stream never ran."""


@dataclass(frozen=True)
class BackfillResult:
    flow: str
    table: str
    first_date: date
    last_date: date
    backfill_id: str
    gold_rows: int
    #: Events the rows reflect (windowed aggregates: their ``_rows``; joins: the joined rows).
    rows_reflected: int
    late_rows_covered: int
    gold_version: int | None
    closed_until: str

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, date) else v for k, v in self.__dict__.items()}


def gold_of(spec: FlowSpec, table: str) -> AnyGold:
    for gold in spec.gold:
        if gold.table == table:
            return gold
    known = ", ".join(g.table for g in spec.gold) or "none"
    raise ConfigError(
        f"{spec.spec_file}: flow {spec.name} has no gold table {table!r} (its gold tables: {known})"
    )


#: The order events arrived in: ingestion time, then the place in the source.
ARRIVAL_ORDER = ("_ingested_at", "_source_partition", "_source_offset")


def check_design(
    spark: SparkSession, spec: FlowSpec, settings: Settings, gold: AnyGold, gold_path: str
) -> None:
    """The gold table exists, belongs to this flow and was built under this spec's design."""
    properties = table_properties(spark, gold_path)
    where = f"{spec.spec_file}: gold ({gold.table})"
    if properties is None:
        raise BackfillRefusedError(f"{where}: no gold table at {gold_path} yet: run the flow first")
    identity = read_identity(FlowState.of(spec, settings))
    flow_id = properties.get(FLOW_ID_PROPERTY)
    if identity is None or flow_id != identity.flow_id:
        raise BackfillRefusedError(
            f"{where}: the table at {gold_path} belongs to flow id {flow_id}, not to flow "
            f"{spec.name}: point the spec at its own table"
        )
    built = properties.get(GOLD_PROPERTY)
    if built != gold.design_key():
        raise BackfillRefusedError(
            f"{where}: the table was built under another design ({built}), the spec now says "
            f"{gold.design_key()}: a backfill would mix both in one table. Change the spec back, "
            f"or rebuild gold with `conflux reset {spec.name} --stage gold`"
        )


def stream_watermark_micros(checkpoint: Location) -> int | None:
    """The watermark of the stateful query's last committed batch (None: it never committed)."""
    committed = sorted(int(name) for name in (checkpoint / "commits").names() if name.isdigit())
    if not committed:
        return None
    lines = (checkpoint / "offsets" / str(committed[-1])).read_text().splitlines()
    metadata = json.loads(lines[1])
    return int(metadata.get("batchWatermarkMs", 0)) * 1000


def gold_watermark_micros(spec: FlowSpec, settings: Settings, gold: AnyGold) -> int | None:
    """The watermark of gold table ``gold``'s stateful query (None: it never committed)."""
    checkpoint = FlowState.of(spec, settings).gold_checkpoint(gold.table)
    return stream_watermark_micros(checkpoint)


def closing_time(day: date, gold: AnyGold) -> datetime:
    """When the stream can change no gold row of ``day`` any more: the next day plus one window
    (windowed aggregates), or plus the join's time bound (joins)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
    return start + timedelta(seconds=gold.closing_delay_seconds())


def last_closed_dates(
    gold: AnyGold, watermark_micros: int | None, count: int
) -> tuple[date, date] | None:
    """The newest ``count`` event dates the watermark has closed (first, last), never before the
    table's ``partitions_start``; None when no date is closed yet."""
    if watermark_micros is None:
        return None
    watermark = datetime.fromtimestamp(watermark_micros / MICROS, UTC)
    last = watermark.date()
    while closing_time(last, gold) > watermark:
        last -= timedelta(days=1)
    if last < gold.partitions_start:
        return None
    return max(last - timedelta(days=count - 1), gold.partitions_start), last


def closed_dates(
    spec: FlowSpec, settings: Settings, table: str, count: int
) -> tuple[date, date] | None:
    """:func:`last_closed_dates` under gold ``table``'s stream watermark (no Spark needed)."""
    gold = gold_of(spec, table)
    return last_closed_dates(gold, gold_watermark_micros(spec, settings, gold), count)


def check_closed(
    first: date, last: date, gold: AnyGold, watermark_micros: int | None, flow: str
) -> None:
    if last < first:
        raise BackfillRefusedError(f"--to {last} is before --from {first}")
    if watermark_micros is None:
        raise BackfillRefusedError(
            f"flow {flow}: gold {gold.table} has no committed stream batch yet, so no date is "
            "closed: run the flow first"
        )
    closes = closing_time(last, gold)
    watermark = datetime.fromtimestamp(watermark_micros / MICROS, UTC)
    behind = " of the side behind" if isinstance(gold, GoldJoinSpec) else ""
    if closes > watermark:
        raise BackfillRefusedError(
            f"flow {flow}: gold {gold.table}: {last} is still open: its rows are final when the "
            f"watermark passes {closes.isoformat()}, and it stands at {watermark.isoformat()} "
            f"(the newest event time{behind} minus allowed_lateness {gold.allowed_lateness}). "
            "Backfill "
            "dates up to the day before, or wait for the stream to move on."
        )


def recompute_join(
    spark: SparkSession,
    spec: FlowSpec,
    settings: Settings,
    gold: GoldJoinSpec,
    first: date,
    last: date,
) -> DataFrame:
    """Joined rows of the left rows of ``first..last``, from all the events of both sides."""
    other = join_input(spec, gold)
    events = {
        LEFT: spark.read.format("delta").load(_events(spec, settings)),
        RIGHT: spark.read.format("delta").load(_events(other, settings)),
    }
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    bounds = {LEFT: (start, end), RIGHT: right_time_range(gold, first, last)}
    schema = input_schema(gold, {side: frame.schema for side, frame in events.items()})
    sides = []
    for side in (LEFT, RIGHT):
        low, high = bounds[side]
        rows = events[side]
        flow = spec if side == LEFT else other
        if reads_event_date(flow, side_of(gold, side).event_time):
            rows = rows.where(F.col("_event_date").between(F.lit(low.date()), F.lit(high.date())))
        sides.append(
            side_rows(rows, gold, side, schema).where(
                (F.col("_event_time") >= F.lit(low))
                & (F.col("_event_time") < F.lit(high))
                & ~future_condition(
                    F.col("_event_time"), F.col("_ingested_at"), gold.max_future_skew
                )
            )
        )
    joined = join_rows(sides[0].unionByName(sides[1]), gold)
    return joined.where(F.col("_event_date").between(F.lit(first), F.lit(last)))


def reads_event_date(spec: FlowSpec, event_time: str) -> bool:
    """Whether ``event_time`` is the events' ``_event_time``, whose date partitions the events
    table (``_event_date``): then a backfill reads only the dates it needs."""
    silver = spec.silver
    return event_time == "_event_time" or (silver is not None and event_time == silver.event_time)


def recompute(
    spec: FlowSpec, events: DataFrame, gold: GoldSpec, first: date, last: date
) -> DataFrame:
    """Gold rows of the windows starting on ``first..last``, from all the events."""
    event_time = F.col(gold.event_time).cast("timestamp")
    duration = timedelta(seconds=duration_seconds(gold.window.duration))
    low = datetime(first.year, first.month, first.day, tzinfo=UTC) - duration
    high = closing_time(last, gold)
    if reads_event_date(spec, gold.event_time):
        events = events.where(F.col("_event_date").between(F.lit(low.date()), F.lit(high.date())))
    kept = dict.fromkeys((*gold.input_columns(), *ARRIVAL_ORDER))
    rows = events.select(
        *(F.col(c) for c in kept if c != "_event_time"), event_time.alias("_event_time")
    ).where(
        (F.col("_event_time") >= F.lit(low))
        & (F.col("_event_time") < F.lit(high))
        & ~future_condition(F.col("_event_time"), F.col("_ingested_at"), gold.max_future_skew)
    )
    if gold.deduplicate:  # the stream keeps a key's first arrival: so does the backfill
        arrival = Window.partitionBy(*gold.deduplicate).orderBy(*ARRIVAL_ORDER)
        rows = rows.withColumn("_nth", F.row_number().over(arrival)).where("_nth = 1").drop("_nth")
    grouped = rows.groupBy(
        window_column(F.col("_event_time"), gold).alias("window"), *gold.group_by
    )
    return (
        grouped.agg(*aggregate_columns(gold))
        .select(*gold_columns(gold))
        .where(F.col("_event_date").between(F.lit(first), F.lit(last)))
    )


def refuse_open_dates(
    spec: FlowSpec, settings: Settings, table: str, first: date, last: date
) -> int | None:
    """Refuse ``first..last`` unless the stream closed every date (no Spark needed, so a refusal
    is quick); returns the stream's watermark."""
    gold = gold_of(spec, table)
    watermark = gold_watermark_micros(spec, settings, gold)
    check_closed(first, last, gold, watermark, spec.name)
    return watermark


def backfill(
    spark: SparkSession, spec: FlowSpec, settings: Settings, table: str, first: date, last: date
) -> BackfillResult:
    """Recompute ``first..last`` of gold ``table`` (see the module doc).

    Raises:
        BackfillRefusedError: a date is not closed yet, or the stream never committed.
    """
    gold = gold_of(spec, table)
    watermark = refuse_open_dates(spec, settings, table, first, last)
    catalog = FlowCatalog.of(spec, settings)
    gold_path = catalog.table(TableRole.GOLD, gold.table).location
    check_design(spark, spec, settings, gold, gold_path)
    # The late rows to record are those the events read next already hold: pin the late table
    # first (a late row is appended after its event), so nothing arriving meanwhile is recorded.
    late_path = catalog.table(TableRole.LATE, gold.table).location
    late_version = delta_version(spark, late_path)
    if isinstance(gold, GoldJoinSpec):
        rows = recompute_join(spark, spec, settings, gold, first, last)
        reflected = F.count(F.lit(1))  # a joined row reflects one pair (or one unmatched row)
        covered = covered_condition(gold, first, last)
    else:
        events = spark.read.format("delta").load(_events(spec, settings))
        rows = recompute(spec, events, gold, first, last)
        reflected = F.sum("_rows")
        covered = (F.to_date("_window_start") >= F.lit(first)) & (
            F.to_date(last_window_start(F.col("_event_time"), gold)) <= F.lit(last)
        )
    rows = rows.persist()
    try:
        totals = rows.agg(F.count(F.lit(1)).alias("n"), reflected.alias("r")).first()
        assert totals is not None
        condition = f"_event_date >= '{first}' AND _event_date <= '{last}'"

        def write() -> None:
            rows.write.format("delta").mode("overwrite").option("replaceWhere", condition).save(
                gold_path
            )

        retry_on_maintenance(write, gold.table, 0)
    finally:
        rows.unpersist()
    backfill_id = uuid.uuid4().hex[:12]
    covered_rows = 0
    if late_version is not None:
        late = spark.read.format("delta").option("versionAsOf", late_version).load(late_path)
        record = catalog.table(TableRole.BACKFILLS, gold.table).location
        covered_rows = _record(
            late.where(covered), late_row_id(gold), record, backfill_id, first, last
        )
    version = delta_version(spark, gold_path)
    return BackfillResult(
        flow=spec.name,
        table=gold.table,
        first_date=first,
        last_date=last,
        backfill_id=backfill_id,
        gold_rows=int(totals["n"]),
        rows_reflected=int(totals["r"] or 0),
        late_rows_covered=covered_rows,
        gold_version=version,
        closed_until=datetime.fromtimestamp((watermark or 0) / MICROS, UTC).isoformat(),
    )


def _record(
    covered: DataFrame,
    row_id: tuple[str, ...],
    record_path: str,
    backfill_id: str,
    first: date,
    last: date,
) -> int:
    """Append the late rows the backfill covered to the record at ``record_path``
    (``<gold>__backfills``); how many.

    A row of windowed aggregates is covered when every window holding it starts on a backfilled
    date (with sliding windows its windows can start on two dates: a backfill of one of them does
    not cover it); a row of a join when every left row it can join is of a backfilled date.
    """
    record = covered.select(
        F.lit(backfill_id).alias("backfill_id"),
        F.current_timestamp().alias("backfilled_at"),
        F.lit(first).alias("first_date"),
        F.lit(last).alias("last_date"),
        *row_id,
        "_event_time",
        "_event_date",
    ).persist()
    try:
        count = record.count()
        if count:  # mergeSchema: a record written before late rows of joins kept their side
            record.write.format("delta").mode("append").option("mergeSchema", "true").save(
                record_path
            )
        return count
    finally:
        record.unpersist()


def unreconciled(spark: SparkSession, spec: FlowSpec, settings: Settings, table: str) -> DataFrame:
    """The late rows of gold ``table`` that no backfill has covered yet."""
    gold = gold_of(spec, table)
    catalog = FlowCatalog.of(spec, settings)
    late = spark.read.format("delta").load(catalog.table(TableRole.LATE, gold.table).location)
    record = catalog.table(TableRole.BACKFILLS, gold.table).location
    if not DeltaTable.isDeltaTable(spark, record):
        return late
    done = spark.read.format("delta").load(record)
    row_id = [c for c in late_row_id(gold) if c in done.columns]
    covered = done.select(*row_id).distinct()
    return late.join(covered, row_id, "left_anti")


def _events(spec: FlowSpec, settings: Settings) -> str:
    """Where flow ``spec``'s silver events are."""
    return FlowCatalog.of(spec, settings).table(TableRole.EVENTS).location

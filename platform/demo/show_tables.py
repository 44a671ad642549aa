"""Print what the demo wrote: row counts, a sample and the Delta history of each bronze table, and
for flows with a silver section its events (a sample), current-state and quarantine tables."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.catalog.roles import TableRole
from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import FlowCatalog
from pipelines.settings import Settings, load_settings
from pipelines.silver.schema_changes import evolved_columns
from pipelines.spark import get_spark_session
from pipelines.spec import FlowSpec, GoldJoinSpec, ddl_fields, load_specs


def _location(spec: FlowSpec, settings: Settings, role: TableRole, gold: str | None = None) -> str:
    return FlowCatalog.of(spec, settings).table(role, gold).location


def show_silver(spark: SparkSession, spec: FlowSpec, settings: Settings) -> None:
    """The flow's silver tables: a sample of events, every current row, the quarantine's reasons."""
    silver = spec.silver
    if silver is None:
        return
    events_path = _location(spec, settings, TableRole.EVENTS)
    if not DeltaTable.isDeltaTable(spark, events_path):
        print(f"\n== {silver.events.table}: not written yet")
        return
    events = spark.read.format("delta").load(events_path)
    keys = list(silver.current.keys) if silver.current else list(silver.columns()[:1])
    print(f"\n== silver events table {silver.events.table} at {events_path}: {events.count()} rows")
    events.select(*keys, "_op", "_sequence", "_event_date").orderBy(F.desc("_sequence")).show(
        5, truncate=False
    )
    evolved = evolved_columns(spark, events_path)
    if evolved:
        names = [name for name, _ in ddl_fields(evolved)]
        print(f"columns evolved into the silver tables from new fields upstream: {evolved}")
        seen = F.greatest(*(F.col(name).isNotNull() for name in names), F.lit(False))
        events.where(seen).select(*keys, *names).show(5)
    if silver.current is not None:
        current = silver.current
        path = _location(spec, settings, TableRole.CURRENT)
        table = spark.read.format("delta").load(path)
        rows = table.count()
        print(f"== silver current-state table {current.table} at {path}: {rows} rows (live keys)")
        table.orderBy(*current.keys).show(8, truncate=28)
    if silver.history is not None:
        show_history(spark, spec, settings)
    path = _location(spec, settings, TableRole.QUARANTINE)
    if DeltaTable.isDeltaTable(spark, path):
        quarantine = spark.read.format("delta").load(path)
        print(f"== silver quarantine table {silver.quarantine.table}: {quarantine.count()} records")
        quarantine.select(
            "partition", "offset", F.concat_ws("; ", "reasons").alias("reasons")
        ).orderBy("partition", "offset").show(20, truncate=False)


#: Characters of a late row's JSON shown (the whole row is in the table).
LATE_ROW_CHARS = 70


def show_gold(spark: SparkSession, spec: FlowSpec, settings: Settings) -> None:
    """Each gold table's newest windows, its late rows and what backfills reconciled."""
    from pipelines.gold.backfill import unreconciled
    from pipelines.gold.watermark import WatermarkLog, micros_to_iso

    locations = FlowState.of(spec, settings)
    for gold in spec.gold:
        path = _location(spec, settings, TableRole.GOLD, gold.table)
        if not DeltaTable.isDeltaTable(spark, path):
            print(f"\n== gold {gold.table}: not written yet")
            continue
        # A late row: when it happened, what it missed, and the whole silver row (key, payload).
        if isinstance(gold, GoldJoinSpec):  # the newest pairs; a late row's side and time
            newest = ["_left_time", *gold.join.keys]
            whole = F.coalesce(F.to_json("_left"), F.to_json("_right"))
            row = F.substring(whole, 1, LATE_ROW_CHARS).alias("row (key first)")
            late_columns = [F.col("_side"), F.col("_event_time"), row]
            what, matched = "joined rows", F.count(F.when(~F.col("_matched"), 1))
            side = " of the side behind"
        else:  # the newest windows; a late row's time and the window it missed
            newest = ["window_start", *gold.group_by]
            row = F.substring(F.to_json("_event"), 1, LATE_ROW_CHARS).alias("row (key first)")
            late_columns = [F.col(c) for c in ("_event_time", "_window_start", "_window_end")]
            late_columns.append(row)
            what, matched, side = "windows", F.lit(None), ""
        table = spark.read.format("delta").load(path)
        record = WatermarkLog(locations.watermark_log(gold.table), 0).latest()
        watermark = record.watermark_micros if record else None
        counts = table.agg(F.count(F.lit(1)), matched).first()
        assert counts is not None
        unmatched = f", {counts[1]} without a match" if counts[1] is not None else ""
        print(
            f"\n== gold table {gold.table} at {path}: {counts[0]} {what}{unmatched}; watermark "
            f"{micros_to_iso(watermark)} (newest event time{side} - {gold.allowed_lateness})"
        )
        table.orderBy(*(F.desc(c) for c in newest[:1]), *newest[1:]).drop(
            "_updated_at", "_joined_at"
        ).show(5, truncate=False)
        late_path = _location(spec, settings, TableRole.LATE, gold.table)
        if DeltaTable.isDeltaTable(spark, late_path):
            late = spark.read.format("delta").load(late_path)
            print(
                f"== late-data table {gold.late.table}: {late.count()} rows that arrived behind "
                "the watermark (kept, never dropped)"
            )
            late.select(*late_columns, "_watermark").orderBy("_event_time").show(5, truncate=False)
            backfills = _location(spec, settings, TableRole.BACKFILLS, gold.table)
            if DeltaTable.isDeltaTable(spark, str(backfills)):
                done = spark.read.format("delta").load(str(backfills))
                print(f"== backfills of {gold.table} (append-only record of the late rows covered)")
                done.groupBy("backfill_id", "first_date", "last_date").agg(
                    F.count(F.lit(1)).alias("late_rows_covered"), F.max("backfilled_at").alias("at")
                ).orderBy("at").show(truncate=False)
            left = unreconciled(spark, spec, settings, gold.table).count()
            print(f"late rows of {gold.table} not yet reconciled by a backfill: {left}")
            day = late.agg(F.max("_event_date")).first()
            if day is not None and day[0] is not None:
                print(f"gold {gold.table} on {day[0]}, the late rows' day:")
                table.where(F.col("_event_date") == F.lit(day[0])).orderBy(*newest).drop(
                    "_updated_at", "_joined_at"
                ).show(5, truncate=False)


def show_history(spark: SparkSession, spec: FlowSpec, settings: Settings) -> None:
    """The history table's size, and every version of the key with the most of them."""
    assert spec.silver is not None and spec.silver.history is not None
    history, keys = spec.silver.history, list(spec.silver.history_keys)
    path = _location(spec, settings, TableRole.HISTORY)
    table = spark.read.format("delta").load(path)
    counts = table.groupBy(*keys).count().orderBy(F.desc("count"), *keys).first()
    print(
        f"== silver history table {history.table} at {path}: {table.count()} versions of "
        f"{table.select(*keys).distinct().count()} keys; open versions: "
        f"{table.where('_is_current').count()}"
    )
    if counts is None:
        return
    key = {k: counts[k] for k in keys}
    print(f"every version of {key} (valid from/to: sequence, here Debezium's lsn):")
    one_key = table.where(F.expr(" AND ".join(f"{k} = {v!r}" for k, v in key.items())))
    one_key.orderBy("_valid_from").drop("_updated_at").show(truncate=28)


def main() -> int:
    settings = load_settings()
    spark = get_spark_session("conflux-show-tables", settings, ui=False)
    spark.sparkContext.setLogLevel("ERROR")  # the tables are the story, not planner WARNs
    for spec in load_specs(settings.flows_dir):
        path = str(FlowState.of(spec, settings).table)
        if not DeltaTable.isDeltaTable(spark, path):
            print(f"\n== {spec.target.table}: not written yet ({spec.trigger.mode} flow)")
            continue
        table = spark.read.format("delta").load(path)
        print(f"\n== bronze table {spec.target.table} at {path}: {table.count()} rows")
        if "value" in table.columns:
            sample = table.select(
                "topic", "partition", "offset", F.col("value").cast("string").alias("value")
            ).orderBy(F.desc("offset"))
        else:
            sample = table.drop("source_modified_at", "ingested_at").orderBy(F.desc("source_file"))
        sample.show(3, truncate=70)
        if "_rescued_data" in table.columns:
            rescued = table.where(F.col("_rescued_data").isNotNull())
            count = rescued.count()
            print(f"rows with _rescued_data (fields that did not fit the stored schema): {count}")
            if count:
                rescued.select("order_id", "amount", "_rescued_data").show(3, truncate=70)
        show_silver(spark, spec, settings)
        show_gold(spark, spec, settings)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

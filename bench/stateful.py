"""``gold_stateful``: a gold table's stateful throughput and state size, and the cost of capturing
late rows, as a ratio to Spark's plain watermark drop.

The harness side (:func:`run_gold_stateful`) runs this file as a child process, which:

1. generates ``records`` silver-shaped events with ``keys`` distinct customers (1M by default:
   1M state rows, all in one daily window), event times rising over the rounds, and 1 % of the
   events of every round after the second two days behind (late: their window has closed);
2. feeds them in ``rounds`` appends to two events tables, one per runner, and after each append
   runs each runner to the end of its input (``availableNow``), the runners interleaved so that
   a slower moment of the machine hits both alike (the appends are not timed):

   * **conflux**: Conflux's gold stages on that events table (:mod:`pipelines.stages.gold`): the
     split query (Conflux's watermark, late rows to the late-data table, on-time rows to the
     input table) then the stateful query (RocksDB, update mode, MERGE into gold);
   * **spark**: the hand-written job Spark's documentation suggests: the events as a Delta
     stream, ``withWatermark`` with the same lateness, the same windowed aggregation on the same
     RocksDB state store, update mode, the same MERGE into a gold table; late rows are dropped
     by Spark's watermark and only counted;

3. checks that both gold tables agree on every on-time row (the rows Conflux captured as late
   are exactly those Spark dropped), and reports events/s of each, the ratio, the state's rows,
   memory and size on disk, and the late rows captured vs. dropped.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Outcome, Row, run_plan_child, say, serve_plan_child

RESULT_PREFIX = "bench.stateful "
LATENESS = "5 minutes"
#: One window holds every key, so the state holds them all (1M rows at 1M keys).
WINDOW = "1 day"
#: Event time covered by each round.
ROUND_MINUTES = 12


@dataclass(frozen=True)
class Plan:
    records: int
    keys: int
    rounds: int


# --------------------------------------------------------------------------- child (Spark) side


def events_round(spark: Any, plan: Plan, round_index: int) -> Any:
    """Round ``round_index``'s events, shaped like a silver events table."""
    from pyspark.sql import functions as F

    per_round = plan.records // plan.rounds
    first = round_index * per_round
    i = F.col("id")
    minutes = F.lit(round_index * ROUND_MINUTES) + (i - first) * ROUND_MINUTES / per_round
    late = (F.lit(round_index) >= 2) & (i % 100 == 0)
    minutes = F.when(late, minutes - 2 * 24 * 60).otherwise(minutes)  # a closed day's window
    base = F.lit("2026-11-20 00:00:00").cast("timestamp")
    return spark.range(first, first + per_round, 1, 4).select(
        F.concat(F.lit("c"), (i % plan.keys).cast("string")).alias("customer"),
        ((i % 1000) / 10).alias("amount"),
        (base + F.make_dt_interval(secs=minutes * 60)).alias("ts"),
        F.lit("bench").alias("_source_topic"),
        (i % 3).cast("int").alias("_source_partition"),
        i.alias("_source_offset"),
        F.lit(round_index).cast("bigint").alias("_batch_id"),
        F.current_timestamp().alias("_ingested_at"),
    )


def conflux_runner() -> tuple[Any, str]:
    """The pipeline of a gold flow (its two gold stages among its stages); the events table's path."""
    from pipelines.catalog.roles import TableRole
    from pipelines.catalog.state import FlowState
    from pipelines.catalog.tables import FlowCatalog
    from pipelines.flow import FlowPipeline
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.progress import ProgressTracker
    from pipelines.settings import load_settings
    from pipelines.spec import parse_spec

    spec = parse_spec(
        {
            "name": "bench_gold",
            "source": {"kind": "kafka", "topics": ["bench_gold"]},
            "target": {"table": "bronze_bench_gold"},
            "silver": {"format": "json", "schema": "customer STRING, amount DOUBLE, ts TIMESTAMP"},
            "gold": [
                {
                    "table": "bench_revenue",
                    "event_time": "ts",
                    "allowed_lateness": LATENESS,
                    "window": {"duration": WINDOW},
                    "group_by": ["customer"],
                    "aggregates": [
                        {"name": "revenue", "function": "sum", "column": "amount"},
                        {"name": "orders", "function": "count"},
                    ],
                }
            ],
        },
        "<bench gold>",
    )
    settings = load_settings()
    locations = FlowState.of(spec, settings)
    write_identity(locations, FlowIdentity.new(spec, locations))

    class Quiet:
        def batch(self, _progress: Any) -> None:
            pass

    pipeline = FlowPipeline(spec, settings, None, ProgressTracker(Quiet()))
    return pipeline, FlowCatalog.of(spec, settings).table(TableRole.EVENTS).location


def spark_query(spark: Any, events: str, gold: str, checkpoint: str) -> Any:
    """The hand-written job: watermark, window, update mode, MERGE."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    def merge(batch: Any, _batch_id: int) -> None:
        DeltaTable.forPath(batch.sparkSession, gold).alias("t").merge(
            batch.alias("s"),
            "t.window_start = s.window_start AND t.window_end = s.window_end "
            "AND t.customer = s.customer",
        ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

    aggregated = (
        spark.readStream.format("delta")
        .load(events)
        .withWatermark("ts", LATENESS)
        .groupBy(F.window("ts", WINDOW).alias("window"), "customer")
        .agg(F.sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "customer",
            "revenue",
            "orders",
        )
    )
    return (
        aggregated.writeStream.outputMode("update")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(merge)
        .trigger(availableNow=True)
        .start()
    )


def state_of(query: Any) -> dict[str, int]:
    from pipelines.progress import state_of as progress_state

    progress = [p for p in query.recentProgress if p.stateOperators]
    state = progress_state(progress[-1]) if progress else None
    dropped = sum(int(o.numRowsDroppedByWatermark) for p in progress for o in p.stateOperators)
    if state is None:
        return {"rows_total": 0, "memory_bytes": 0, "sst_bytes": 0, "dropped": dropped}
    custom = state["operators"][0]["custom"]
    return {
        "rows_total": state["rows_total"],
        "memory_bytes": state["memory_bytes"],
        "sst_bytes": int(custom.get("rocksdbSstFileSize", 0)),
        "dropped": dropped,
    }


def measure(spark: Any, raw: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pipelines.catalog.roles import TableRole, is_gold_stage
    from pipelines.catalog.tables import FlowCatalog
    from pipelines.settings import load_settings

    plan = Plan(**raw)
    settings = load_settings()
    pipeline, conflux_events = conflux_runner()
    catalog = FlowCatalog.of(pipeline.spec, settings)
    gold_path = catalog.table(TableRole.GOLD, "bench_revenue").location
    late_path = catalog.table(TableRole.LATE, "bench_revenue").location
    work = settings.runtime_dir / "plain"
    shutil.rmtree(work, ignore_errors=True)
    plain_events, plain_gold = str(work / "events"), str(work / "gold")
    seconds = {"conflux": 0.0, "spark": 0.0}
    gold_stages = [s for s in pipeline.stages if is_gold_stage(s.kind)]
    last: dict[str, Any] = {}
    dropped = 0
    for round_index in range(plan.rounds):
        batch = events_round(spark, plan, round_index).persist()
        for path in (conflux_events, plain_events):
            batch.write.format("delta").mode("append").save(path)
        batch.unpersist()
        if round_index == 0:
            for stage in gold_stages:
                stage.prepare(spark)
            empty = spark.read.format("delta").load(gold_path)
            empty.select("window_start", "window_end", "customer", "revenue", "orders").limit(
                0
            ).write.format("delta").save(plain_gold)
        started = time.monotonic()
        for stage in gold_stages:
            query = pipeline.start(stage, spark, "available_now")
            query.awaitTermination()
            last[stage.kind] = query
        seconds["conflux"] += time.monotonic() - started
        started = time.monotonic()
        query = spark_query(spark, plain_events, plain_gold, str(work / "checkpoint"))
        query.awaitTermination()
        seconds["spark"] += time.monotonic() - started
        dropped += state_of(query)["dropped"]
        last["spark"] = query
        say(f"gold_stateful: round {round_index + 1}/{plan.rounds} done")
    conflux_state = state_of(last["gold.bench_revenue"])
    spark_state = state_of(last["spark"])
    late = spark.read.format("delta").load(late_path).count()
    conflux_gold = spark.read.format("delta").load(gold_path)
    columns = ["window_start", "customer", F.round("revenue", 4).alias("revenue"), "orders"]
    ours = conflux_gold.select(*columns)
    theirs = spark.read.format("delta").load(plain_gold).select(*columns)
    differ = ours.exceptAll(theirs).count() + theirs.exceptAll(ours).count()
    reflected = conflux_gold.agg(F.sum("_rows")).first()
    if differ or late != dropped or conflux_state["dropped"]:
        raise SystemExit(
            f"the runners disagree: {differ} gold rows differ; Conflux captured {late} late rows, "
            f"Spark dropped {dropped}; Conflux's stateful query dropped {conflux_state['dropped']}"
        )
    return {
        **raw,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "late_captured": late,
        "spark_dropped": dropped,
        "rows_reflected": int(reflected[0]) if reflected else 0,
        "conflux_state": conflux_state,
        "spark_state": spark_state,
    }


def child_main(argv: list[str]) -> int:
    return serve_plan_child(argv, "stateful", RESULT_PREFIX, measure)


# --------------------------------------------------------------------------- harness side


def run_gold_stateful(workdir: Path, jars_dir: Path, plan: Plan) -> Outcome:
    say(
        f"gold_stateful: {plan.records:,} events, {plan.keys:,} keys, {plan.rounds} rounds, "
        f"Conflux's gold stages vs Spark's plain watermark; log {workdir / 'stateful.log'}"
    )
    report = run_plan_child("stateful", plan, workdir, jars_dir, RESULT_PREFIX)
    return Outcome(_rows(report), report)


def _rows(report: dict[str, Any]) -> list[Row]:
    notes = (
        f"{report['records']:,} events, {report['keys']:,} distinct keys, {WINDOW} windows, "
        f"{report['rounds']} availableNow rounds"
    )
    return runner_rows(
        "gold_stateful", report, report["records"], notes, "Spark's watermark drop", "late rows"
    )


def runner_rows(
    benchmark: str, report: dict[str, Any], events: int, notes: str, spark_label: str, late: str
) -> list[Row]:
    """The rows of a Conflux-vs-Spark stateful benchmark: events/s and the state of each runner,
    then the late rows Conflux captured against those Spark dropped."""
    seconds = report["seconds"]
    rows = []
    for runner, label in (("spark", spark_label), ("conflux", "Conflux late capture")):
        state = report[f"{runner}_state"]
        rows.append(
            Row(
                benchmark,
                f"{label}: events/s (ratio to Spark)",
                f"{events / seconds[runner]:,.0f} ({seconds['spark'] / seconds[runner]:.2f}x)",
                f"{notes}; {seconds[runner]:.1f} s in all",
            )
        )
        rows.append(
            Row(
                benchmark,
                f"{label}: state rows / memory / RocksDB on disk",
                f"{state['rows_total']:,} / {state['memory_bytes'] / 2**20:.1f} MiB / "
                f"{state['sst_bytes'] / 2**20:.1f} MiB",
                "after the last round",
            )
        )
    rows.append(
        Row(
            benchmark,
            f"{late}: captured by Conflux / dropped by Spark",
            f"{report['late_captured']:,} / {report['spark_dropped']:,}",
            "the same rows: both tables agree on every other row",
        )
    )
    return rows


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

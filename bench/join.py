"""``gold_join``: a gold join's throughput and state, and the cost of capturing both sides' late
rows, as a ratio to Spark's plain stream-stream join.

The harness side (:func:`run_gold_join`) runs this file as a child process, which:

1. generates ``orders`` silver-shaped orders and the payments of 90 % of them (paid 0 to 19
   minutes after the order), event times rising over the rounds, and 1 % of the orders and 1 %
   of the payments (of other orders) of every round after the second two days behind (late on
   both sides);
2. feeds them in ``rounds`` appends to two pairs of events tables, one pair per runner, and after
   each append runs each runner to the end of its input (``availableNow``), interleaved:

   * **conflux**: Conflux's gold stages of a left outer join (:mod:`pipelines.stages.gold_join`):
     the split query over both events tables (Conflux's two-sided watermark, late rows of both
     sides to the late-data table, on-time rows to the input table) then the join (RocksDB,
     append under the batch's transaction id);
   * **spark**: the job Spark's documentation shows: both events tables as Delta streams, each
     ``withWatermark`` with the same lateness, the same left outer join within 30 minutes on the
     same RocksDB state store, appended to a Delta table; late rows are dropped by Spark's
     watermark and only counted;

3. checks that both joined tables agree on every row (the rows Conflux captured as late are
   exactly those Spark dropped), and reports events/s of each (orders and payments), the ratio,
   the join state's rows, memory and size on disk, and the late rows captured vs. dropped.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Outcome, Row, run_plan_child, say, serve_plan_child
from bench.stateful import runner_rows, state_of

RESULT_PREFIX = "bench.join "
LATENESS = "5 minutes"
WITHIN_MINUTES = 30
#: Event time covered by each round.
ROUND_MINUTES = 60


@dataclass(frozen=True)
class Plan:
    orders: int
    rounds: int


# --------------------------------------------------------------------------- child (Spark) side


def round_rows(spark: Any, plan: Plan, round_index: int) -> tuple[Any, Any]:
    """Round ``round_index``'s orders and payments, shaped like silver events tables."""
    from pyspark.sql import functions as F

    per_round = plan.orders // plan.rounds
    first = round_index * per_round
    i = F.col("id")
    minutes = F.lit(round_index * ROUND_MINUTES) + (i - first) * ROUND_MINUTES / per_round

    def behind(remainder: int) -> Any:  # 1 % of a side's rows, from the third round: a closed day
        late = (F.lit(round_index) >= 2) & (i % 100 == remainder)
        return F.when(late, minutes - 2 * 24 * 60).otherwise(minutes)

    base = F.lit("2026-11-20 00:00:00").cast("timestamp")
    ids = spark.range(first, first + per_round, 1, 4)
    coordinates = [
        (i % 3).cast("int").alias("_source_partition"),
        i.alias("_source_offset"),
        F.lit(round_index).cast("bigint").alias("_batch_id"),
        F.current_timestamp().alias("_ingested_at"),
    ]
    orders = ids.select(
        i.alias("order_id"),
        ((i % 1000) / 10).alias("amount"),
        (base + F.make_dt_interval(secs=behind(0) * 60)).alias("ts"),
        F.lit("bench_orders").alias("_source_topic"),
        *coordinates,
    )
    payments = ids.where(i % 10 != 0).select(
        i.alias("payment_id"),
        i.alias("order_id"),
        ((i % 1000) / 10).alias("paid"),
        (base + F.make_dt_interval(secs=(behind(5) + i % 20) * 60)).alias("paid_at"),
        F.lit("bench_payments").alias("_source_topic"),
        *coordinates,
    )
    return orders, payments


def conflux_runner(folder: Path) -> tuple[Any, dict[str, str]]:
    """The pipeline of the flow with the join (its two gold stages among its stages) and the
    paths of both flows' events tables."""
    from pipelines.catalog.roles import TableRole
    from pipelines.catalog.state import FlowState
    from pipelines.catalog.tables import FlowCatalog
    from pipelines.flow import FlowPipeline
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.progress import ProgressTracker
    from pipelines.settings import load_settings
    from pipelines.spec import load_specs

    folder.mkdir(parents=True, exist_ok=True)
    flows = {
        "bench_payments": {
            "silver": {
                "format": "json",
                "schema": "payment_id BIGINT, order_id BIGINT, paid DOUBLE, paid_at TIMESTAMP",
            }
        },
        "bench_orders": {
            "silver": {"format": "json", "schema": "order_id BIGINT, amount DOUBLE, ts TIMESTAMP"},
            "gold": [
                {
                    "table": "bench_order_payments",
                    "allowed_lateness": LATENESS,
                    "join": {
                        "how": "left_outer",
                        "keys": ["order_id"],
                        "left": {"event_time": "ts", "columns": ["amount"]},
                        "right": {
                            "flow": "bench_payments",
                            "event_time": "paid_at",
                            "columns": ["payment_id", "paid"],
                        },
                        "within": {"after": f"{WITHIN_MINUTES} minutes"},
                    },
                }
            ],
        },
    }
    for name, sections in flows.items():
        spec = {
            "name": name,
            "source": {"kind": "kafka", "topics": [name]},
            "target": {"table": f"bronze_{name}"},
            **sections,
        }
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    specs = {s.name: s for s in load_specs(folder)}
    settings = load_settings()
    for spec in specs.values():
        locations = FlowState.of(spec, settings)
        write_identity(locations, FlowIdentity.new(spec, locations))

    class Quiet:
        def batch(self, _progress: Any) -> None:
            pass

    pipeline = FlowPipeline(specs["bench_orders"], settings, None, ProgressTracker(Quiet()))
    events = {
        name: FlowCatalog.of(spec, settings).table(TableRole.EVENTS).location
        for name, spec in specs.items()
    }
    return pipeline, events


def spark_query(spark: Any, orders: str, payments: str, joined: str, checkpoint: str) -> Any:
    """The hand-written job: two Delta streams, a watermark on each, a left outer join within
    the bound, appended to Delta."""
    from pyspark.sql import functions as F

    left = (
        spark.readStream.format("delta")
        .load(orders)
        .select("order_id", "amount", F.col("ts").alias("_left_time"))
        .withWatermark("_left_time", LATENESS)
    )
    right = (
        spark.readStream.format("delta")
        .load(payments)
        .select(
            F.col("order_id").alias("paid_order_id"),
            "payment_id",
            "paid",
            F.col("paid_at").alias("_right_time"),
        )
        .withWatermark("_right_time", LATENESS)
    )
    condition = F.expr(
        "order_id = paid_order_id AND _right_time >= _left_time AND "
        f"_right_time <= _left_time + INTERVAL {WITHIN_MINUTES} MINUTES"
    )
    return (
        left.join(right, condition, "left_outer")
        .drop("paid_order_id")
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(joined)
    )


def measure(spark: Any, raw: dict[str, Any]) -> dict[str, Any]:
    from pipelines.catalog.roles import TableRole, is_gold_stage
    from pipelines.catalog.tables import FlowCatalog
    from pipelines.settings import load_settings

    plan = Plan(**raw)
    settings = load_settings()
    pipeline, conflux_events = conflux_runner(settings.runtime_dir / "flows")
    work = settings.runtime_dir / "plain"
    shutil.rmtree(work, ignore_errors=True)
    plain = {name: str(work / name) for name in ("orders", "payments", "joined", "checkpoint")}
    seconds = {"conflux": 0.0, "spark": 0.0}
    gold_stages = [s for s in pipeline.stages if is_gold_stage(s.kind)]
    last: dict[str, Any] = {}
    dropped, events = 0, 0
    for round_index in range(plan.rounds):
        orders, payments = (f.persist() for f in round_rows(spark, plan, round_index))
        events += orders.count() + payments.count()
        for frame, paths in (
            (orders, (conflux_events["bench_orders"], plain["orders"])),
            (payments, (conflux_events["bench_payments"], plain["payments"])),
        ):
            for path in paths:
                frame.write.format("delta").mode("append").save(path)
            frame.unpersist()
        if round_index == 0:
            for stage in gold_stages:
                stage.prepare(spark)
        started = time.monotonic()
        for stage in gold_stages:
            query = pipeline.start(stage, spark, "available_now")
            query.awaitTermination()
            last[stage.kind] = query
        seconds["conflux"] += time.monotonic() - started
        started = time.monotonic()
        query = spark_query(
            spark, plain["orders"], plain["payments"], plain["joined"], plain["checkpoint"]
        )
        query.awaitTermination()
        seconds["spark"] += time.monotonic() - started
        dropped += state_of(query)["dropped"]
        last["spark"] = query
        say(f"gold_join: round {round_index + 1}/{plan.rounds} done")
    conflux_state = state_of(last["gold.bench_order_payments"])
    spark_state = state_of(last["spark"])
    catalog = FlowCatalog.of(pipeline.spec, settings)
    late_path = catalog.table(TableRole.LATE, "bench_order_payments").location
    late = spark.read.format("delta").load(late_path).count()
    joined = spark.read.format("delta").load(
        catalog.table(TableRole.GOLD, "bench_order_payments").location
    )
    columns = ["order_id", "amount", "payment_id", "paid", "_left_time", "_right_time"]
    ours = joined.select(*columns)
    theirs = spark.read.format("delta").load(plain["joined"]).select(*columns)
    differ = ours.exceptAll(theirs).count() + theirs.exceptAll(ours).count()
    if differ or late != dropped or conflux_state["dropped"]:
        raise SystemExit(
            f"the runners disagree: {differ} joined rows differ; Conflux captured {late} late "
            f"rows, Spark dropped {dropped}; Conflux's join dropped {conflux_state['dropped']}"
        )
    return {
        **raw,
        "events": events,
        "joined_rows": ours.count(),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "late_captured": late,
        "spark_dropped": dropped,
        "conflux_state": conflux_state,
        "spark_state": spark_state,
    }


def child_main(argv: list[str]) -> int:
    return serve_plan_child(argv, "join", RESULT_PREFIX, measure)


# --------------------------------------------------------------------------- harness side


def run_gold_join(workdir: Path, jars_dir: Path, plan: Plan) -> Outcome:
    say(
        f"gold_join: {plan.orders:,} orders and 90 % as many payments, {plan.rounds} rounds, "
        f"Conflux's gold join vs Spark's plain join; log {workdir / 'join.log'}"
    )
    report = run_plan_child("join", plan, workdir, jars_dir, RESULT_PREFIX)
    return Outcome(_rows(report), report)


def _rows(report: dict[str, Any]) -> list[Row]:
    notes = (
        f"{report['orders']:,} orders + payments ({report['events']:,} events), left outer within "
        f"{WITHIN_MINUTES} minutes, {report['rounds']} availableNow rounds, "
        f"{report['joined_rows']:,} joined rows"
    )
    return runner_rows(
        "gold_join",
        report,
        report["events"],
        notes,
        "Spark's plain join",
        "late rows of both sides",
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

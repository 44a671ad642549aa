"""``rules_throughput``: silver throughput with 0, 5 and 20 row expectations, as ratios to none.

Expectations are evaluated in the projection that parses a batch and counted in the aggregation
the stage runs anyway (:mod:`pipelines.silver.expectations`), so their cost should be a few
expressions per row, not a scan per rule. This benchmark measures that through the real code
path. The harness side (:func:`run_rules_throughput`) runs this file as a child process, which:

1. builds one bronze-shaped batch of ``records`` JSON orders (Kafka key, value bytes and
   coordinates), 1 % of them failing a ``drop`` rule, and caches it (the input is not measured);
2. for each variant (0, 5 and 20 expectations: named rules of :mod:`quality.rules` and SQL
   expressions, warn and drop), prepares a silver stage of its own (events and quarantine, no
   current table, so the rules' share is not hidden behind a MERGE) and runs
   ``stage.write_batch`` on the batch ``repeats`` times, the variants interleaved so that a
   slower moment of the machine hits each alike;
3. checks each run's accounting (rows in = events + quarantined) and the dropped count, and
   reports the median seconds per batch, rows/s and the ratio to no rules.

A fourth variant, no rules with ``schema_changes.new_columns: ignore``, prices the look at each
record's field names that the default schema-change policy (``evolve``) takes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Outcome, Row, median, run_plan_child, say, serve_plan_child

RESULT_PREFIX = "bench.rules "
SCHEMA = "id BIGINT, amount DOUBLE, status STRING, email STRING, note STRING, created_at TIMESTAMP"
#: Twenty expectations over the orders schema; the first five are the 5-rule variant.
EXPECTATIONS: list[dict[str, Any]] = [
    {"name": "amount_range", "rule": "between", "args": {"column": "amount", "min": 0, "max": 1e6}, "action": "drop"},
    {"name": "known_status", "rule": "values_in_set", "args": {"column": "status", "values": ["new", "paid", "shipped"]}, "action": "drop"},
    {"name": "email_present", "rule": "not_null", "args": {"column": "email"}, "action": "drop"},
    {"name": "email_domain", "expr": "email LIKE '%@example.com'", "action": "warn"},
    {"name": "not_future", "rule": "not_in_future", "args": {"column": "created_at", "skew": "1 hour"}, "action": "drop"},
    {"name": "after_1970", "rule": "not_before", "args": {"column": "created_at"}, "action": "drop"},
    {"name": "note_size", "rule": "max_length", "args": {"column": "note", "length": 1000}, "action": "drop"},
    {"name": "note_present", "rule": "not_empty", "args": {"column": "note"}, "action": "warn"},
    {"name": "email_shape", "rule": "matches", "args": {"column": "email", "pattern": "[a-z0-9.]+@[a-z0-9.]+"}, "action": "warn"},
    {"name": "id_positive", "expr": "id > 0", "action": "drop"},
    {"name": "amount_cents", "expr": "round(amount, 2) = amount", "action": "warn"},
    {"name": "status_lower", "expr": "status = lower(status)", "action": "warn"},
    {"name": "small_order", "expr": "amount < 100000", "action": "warn"},
    {"name": "id_present", "rule": "not_null", "args": {"column": "id"}, "action": "drop"},
    {"name": "created_present", "rule": "not_null", "args": {"column": "created_at"}, "action": "warn"},
    {"name": "recent", "expr": "created_at > timestamp'2020-01-01'", "action": "warn"},
    {"name": "note_ascii", "expr": "note RLIKE '^[ -~]*$'", "action": "warn"},
    {"name": "email_short", "rule": "max_length", "args": {"column": "email", "length": 254}, "action": "drop"},
    {"name": "paid_amount", "expr": "status <> 'paid' OR amount > 0", "action": "warn"},
    {"name": "id_range", "rule": "between", "args": {"column": "id", "min": 1}, "action": "drop"},
]  # fmt: skip
#: (label, expectations, silver.schema_changes.new_columns): the default policy (evolve) looks at
#: every record's field names; ``ignore`` (with json's default missing_columns: allow) does not,
#: which prices that look.
VARIANTS: tuple[tuple[str, int, str], ...] = (
    ("0", 0, "evolve"),
    ("0-ignore", 0, "ignore"),
    ("5", 5, "evolve"),
    ("20", 20, "evolve"),
)


@dataclass(frozen=True)
class Plan:
    records: int
    repeats: int


# --------------------------------------------------------------------------- child (Spark) side


def bronze_batch(spark: Any, records: int) -> Any:
    """``records`` orders as bronze rows; every 100th has a negative amount (``amount_range``)."""
    from pyspark.sql import functions as F

    i = F.col("id")
    statuses = F.array(F.lit("new"), F.lit("paid"), F.lit("shipped"))
    order = F.struct(
        (i + 1).alias("id"),
        F.when(i % 100 == 0, F.lit(-1.0)).otherwise((i % 1000) / 4).alias("amount"),
        F.element_at(statuses, (i % 3 + 1).cast("int")).alias("status"),
        F.concat(F.lit("c"), i.cast("string"), F.lit("@example.com")).alias("email"),
        F.lit("a short note").alias("note"),
        F.lit("2026-01-02T03:04:05Z").alias("created_at"),
    )
    now = F.current_timestamp()
    return spark.range(0, records, 1, 4).select(
        F.concat(F.lit('{"id":'), (i + 1).cast("string"), F.lit("}")).cast("binary").alias("key"),
        F.to_json(order).cast("binary").alias("value"),
        F.lit("bench_orders").alias("topic"),
        (i % 3).cast("int").alias("partition"),
        i.alias("offset"),
        now.alias("kafka_timestamp"),
        now.alias("ingested_at"),
        F.to_date(now).alias("ingest_date"),
    )


def stage_for(spark: Any, label: str, rules: int, new_columns: str) -> Any:
    from pipelines.catalog.state import FlowState
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.settings import load_settings
    from pipelines.spec import parse_spec
    from pipelines.stages.silver import SilverStage

    name = f"rules{label.replace('-', '_')}"
    spec = parse_spec(
        {
            "name": name,
            "source": {"kind": "kafka", "topics": [name]},
            "target": {"table": f"bronze_{name}"},
            "silver": {
                "format": "json",
                "schema": SCHEMA,
                "expectations": EXPECTATIONS[:rules],
                "schema_changes": {"new_columns": new_columns},
            },
        },
        f"<bench {name}>",
    )
    settings = load_settings()
    locations = FlowState.of(spec, settings)
    write_identity(locations, FlowIdentity.new(spec, locations))
    stage = SilverStage(spec, settings, None, lambda _commit: None)
    stage.prepare(spark)
    return stage


def measure(spark: Any, plan: Plan) -> dict[str, Any]:
    batch = bronze_batch(spark, plan.records).persist()
    batch.count()
    stages = {label: stage_for(spark, label, rules, policy) for label, rules, policy in VARIANTS}
    expectations = {label: rules for label, rules, _ in VARIANTS}
    seconds: dict[str, list[float]] = {label: [] for label in stages}
    for stage in stages.values():  # warm-up: the first batch of a session pays for compiling
        stage.write_batch(batch, 0)
    for repeat in range(1, plan.repeats + 1):
        for label, stage in stages.items():
            rules = expectations[label]
            started = time.monotonic()
            commit = stage.write_batch(batch, repeat)
            seconds[label].append(time.monotonic() - started)
            quality = commit.quality
            if (
                quality["rows_in"]
                != quality["events"] + quality["quarantined"] + quality["ignored"]
            ):
                raise SystemExit(f"{label}: the rows do not add up: {quality}")
            expected_dropped = 0 if rules == 0 else (plan.records + 99) // 100
            if quality["dropped"] != expected_dropped:
                raise SystemExit(
                    f"{label}: {quality['dropped']} dropped, expected {expected_dropped}"
                )
        say(f"rules_throughput: repeat {repeat}/{plan.repeats} done")
    return {
        "records": plan.records,
        "repeats": plan.repeats,
        "seconds": {str(r): [round(s, 3) for s in v] for r, v in seconds.items()},
    }


def child_main(argv: list[str]) -> int:
    return serve_plan_child(
        argv, "rules", RESULT_PREFIX, lambda spark, raw: measure(spark, Plan(**raw))
    )


# --------------------------------------------------------------------------- harness side


def run_rules_throughput(workdir: Path, jars_dir: Path, plan: Plan) -> Outcome:
    say(
        f"rules_throughput: batches of {plan.records:,} records through silver with "
        f"{', '.join(label for label, _, _ in VARIANTS)} expectations, {plan.repeats} repeats; "
        f"log {workdir / 'rules.log'}"
    )
    report = run_plan_child("rules", plan, workdir, jars_dir, RESULT_PREFIX)
    return Outcome(_rows(report), report)


def _rows(report: dict[str, Any]) -> list[Row]:
    records = report["records"]
    base = median(report["seconds"]["0"])
    rows = []
    for label, rules, new_columns in VARIANTS:
        runs = report["seconds"][label]
        middle = median(runs)
        rows.append(
            Row(
                "rules_throughput",
                f"silver with {rules} expectations, new_columns: {new_columns}: records/s "
                "(ratio to 0)",
                f"{records / middle:,.0f} ({base / middle:.2f}x)",
                f"batches of {records:,} JSON records, events + quarantine; median of "
                f"{len(runs)} batches ({min(runs):.2f}-{max(runs):.2f} s)",
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

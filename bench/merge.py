"""``merge_throughput``: silver's MERGE into a current-state or history table, in upserts/s, by
table size.

The harness side (:func:`run_merge_throughput`) runs this file as a child process (the harness has
no JVM), which drives the real code path of the silver stage:

1. a :class:`~pipelines.stages.silver.SilverStage` is built from a parsed spec (Debezium, the
   ``customers`` schema, ``current`` keyed by ``id``, sequenced by ``_source_lsn``) and Settings
   pointing at a temporary runtime folder; the flow identity is written and ``stage.prepare``
   creates every silver table exactly as the stage does (``designs()`` + ``ensure_table``);
2. the current table is loaded with ``keys`` live rows by a plain Delta append of generated rows in
   the current table's shape (``spark.range``, no Python loop over rows);
3. each measured batch is an events-shaped DataFrame (the schema's columns + ``EVENT_METADATA``)
   of ``batch`` upserts, 80 % updates of distinct existing keys spread over the whole key space
   (a multiplicative permutation of the key range) and 20 % inserts of new keys; it is persisted
   and counted first (in the stage the parsed batch is persisted too), then ``stage._merge`` runs
   ``reduce_batch`` + ``drop_deleted`` + ``merge_current`` under ``idempotent_session``; only that
   call is timed.

For a **history** table (``--merge-table history``) the events table is loaded with one create
event per key and the history table with the matching open version per key; each batch's events
(every update changes ``name``, a tracked column) are appended to the events table untimed, then
``stage._merge_history`` (recompute the touched keys' versions from the events table, diff, MERGE)
is timed: each update closes a version and opens one, each new key opens one.

Variants (each a fresh table): deletion vectors on or off (``delta.enableDeletionVectors``, set
after creation; the stage's default is on) and extra session confs (e.g.
``spark.sql.shuffle.partitions``, ``spark.databricks.delta.merge.materializeSource``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    BENCH_DIR,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    conflux_env,
    last_json_line,
    median,
    say,
)

RESULT_PREFIX = "bench.merge "
BATCH_PREFIX = "bench.merge.batch "
SCHEMA_DDL = "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP"
#: A prime coprime to every key count used (powers of 2 and 5 times small numbers): ``i * P mod n``
#: visits distinct keys spread over the whole key space.
PERMUTE = 2_654_435_761
NEW_FRACTION = 0.2


@dataclass(frozen=True)
class Variant:
    """One table to measure: its size, whether it uses deletion vectors, extra session confs."""

    keys: int
    batch: int
    deletion_vectors: bool
    conf: dict[str, str]
    table: str = "current"

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.conf.items())
        dv = "DV" if self.deletion_vectors else "no DV"
        return f"{self.table}: {self.keys:,} keys, batch {self.batch:,}, {dv}" + (
            f", {extra}" if extra else ""
        )


# --------------------------------------------------------------------------- child (Spark) side


def flow_spec(name: str, table: str = "current") -> Any:
    from pipelines.spec import parse_spec

    tables: dict[str, Any] = (
        {"current": {"table": f"{name}_current", "keys": ["id"]}}
        if table == "current"
        else {"history": {"table": f"{name}_history", "keys": ["id"]}}
    )
    return parse_spec(
        {
            "name": name,
            "source": {"kind": "kafka", "topics": [f"{name}_cdc"]},
            "target": {"table": f"bronze_{name}"},
            "silver": {"format": "debezium", "schema": SCHEMA_DDL, **tables},
        },
        f"<bench {name}>",
    )


def _rows(spark: Any, start: int, count: int, partitions: int) -> Any:
    """``count`` customers ``start``.. as the schema's columns (``id`` plus values)."""
    from pyspark.sql import functions as F

    frame = spark.range(start, start + count, 1, partitions)
    return _values(frame, F.col("id"))


def _values(frame: Any, key: Any, version: int = 0) -> Any:
    from pyspark.sql import functions as F

    tiers = F.array(*(F.lit(t) for t in ("free", "silver", "gold", "platinum")))
    return frame.select(
        key.alias("id"),
        F.concat(F.lit("Customer "), key.cast("string"), F.lit(f" v{version}")).alias("name"),
        F.concat(F.lit("c"), key.cast("string"), F.lit("@example.com")).alias("email"),
        F.element_at(tiers, (key % 4 + 1).cast("int")).alias("tier"),
        F.current_timestamp().alias("updated_at"),
    )


def load_current(spark: Any, path: str, keys: int) -> float:
    """Append ``keys`` live rows in the current table's shape; return the seconds it took."""
    from pyspark.sql import functions as F

    partitions = max(2, keys // 1_000_000)
    started = time.monotonic()
    (
        _rows(spark, 0, keys, partitions)
        .withColumn("_sequence", F.col("id"))
        .withColumn("_op", F.lit("r"))
        .withColumn("_event_time", F.current_timestamp())
        .withColumn("_updated_at", F.current_timestamp())
        .write.format("delta")
        .mode("append")
        .save(path)
    )
    return time.monotonic() - started


def load_history(spark: Any, events_path: str, history_path: str, keys: int) -> float:
    """One create event per key in the events table, its open version in the history table."""
    from pyspark.sql import functions as F

    from pipelines.silver.parse import EVENT_METADATA

    partitions = max(2, keys // 1_000_000)
    started = time.monotonic()
    now = F.current_timestamp()
    rows = _rows(spark, 0, keys, partitions)
    metadata = {
        "_op": F.lit("c"),
        "_sequence": F.col("id"),
        "_event_time": now,
        "_event_date": F.to_date(now),
        "_source_topic": F.lit("bench_cdc"),
        "_source_partition": F.lit(0),
        "_source_offset": F.col("id"),
        "_source_timestamp": now,
        "_source_ts_ms": F.unix_millis(now),
        "_source_lsn": F.col("id"),
        "_ingested_at": now,
        "_batch_id": F.lit(-1).cast("long"),
    }
    rows.select("*", *(value.alias(name) for name, value in metadata.items())).select(
        *rows.columns, *EVENT_METADATA
    ).write.format("delta").mode("append").partitionBy("_event_date").save(events_path)
    rows.select(
        "*",
        F.col("id").alias("_valid_from"),
        F.lit(None).cast("long").alias("_valid_to"),
        now.alias("_valid_from_time"),
        F.lit(None).cast("timestamp").alias("_valid_to_time"),
        F.lit(True).alias("_is_current"),
        now.alias("_updated_at"),
    ).write.format("delta").mode("append").save(history_path)
    return time.monotonic() - started


def events_batch(spark: Any, index: int, existing: int, batch: int, first_sequence: int) -> Any:
    """One batch of events: 80 % updates of distinct existing keys, 20 % inserts of new keys."""
    from pyspark.sql import functions as F

    inserts = int(batch * NEW_FRACTION)
    updates = batch - inserts
    if updates > existing:
        raise SystemExit(f"a batch of {updates:,} updates needs that many existing keys")
    offset = index * 7_919 % existing
    picks = spark.range(0, batch, 1, 4)
    i = F.col("id")
    key = F.when(i < updates, (i * PERMUTE + offset) % existing).otherwise(existing + i - updates)
    frame = _values(picks.withColumn("_i", i), key, index + 1).withColumn("_i", i)
    return change_events(
        frame,
        updates,
        sequence=F.lit(first_sequence) + F.col("_i"),
        source_partition=F.col("_i") % 3,
        source_offset=F.lit(index * batch) + F.col("_i"),
        batch_id=index,
    )


def change_events(
    frame: Any,
    updates: int,
    sequence: Any,
    source_partition: Any,
    source_offset: Any,
    batch_id: int,
) -> Any:
    """Rows of ``frame`` (customers with a row number ``_i``) as the parsed change events a silver
    batch MERGEs: the first ``updates`` rows are updates (``u``), the rest creates (``c``)."""
    from pyspark.sql import functions as F

    now = F.current_timestamp()
    return frame.select(
        "id",
        "name",
        "email",
        "tier",
        "updated_at",
        F.when(F.col("_i") < updates, F.lit("u")).otherwise(F.lit("c")).alias("_op"),
        sequence.alias("_sequence"),
        now.alias("_event_time"),
        F.to_date(now).alias("_event_date"),
        F.lit("bench_cdc").alias("_source_topic"),
        source_partition.cast("int").alias("_source_partition"),
        source_offset.alias("_source_offset"),
        now.alias("_source_timestamp"),
        F.unix_millis(now).alias("_source_ts_ms"),
        sequence.alias("_source_lsn"),
        now.alias("_ingested_at"),
        F.lit(batch_id).cast("long").alias("_batch_id"),
    )


def file_count(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    return int(detail["numFiles"]) if detail is not None else 0


def last_metrics(spark: Any, path: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, path).history(1).first()
    return dict(row["operationMetrics"] or {}) if row is not None else {}


def measure(
    spark: Any, runtime: Path, number: int, variant: Variant, batches: int
) -> dict[str, Any]:
    """Create the stage's tables, load the current table, MERGE ``batches`` batches into it."""
    from pipelines.catalog.state import FlowState
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.settings import load_settings
    from pipelines.silver.parse import EVENT_METADATA
    from pipelines.stages.silver import SilverStage

    settings = load_settings()
    spec = flow_spec(f"merge{number}", variant.table)
    locations = FlowState.of(spec, settings)
    write_identity(locations, FlowIdentity.new(spec, locations))
    stage = SilverStage(spec, settings, None, lambda _commit: None)
    stage.prepare(spark)
    history = variant.table == "history"
    current = stage.history_path if history else stage.current_path
    assert current is not None
    dv = "true" if variant.deletion_vectors else "false"
    spark.sql(
        f"ALTER TABLE delta.`{current}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = '{dv}')"
    )
    if history:
        load_seconds = load_history(spark, stage.events_path, current, variant.keys)
    else:
        load_seconds = load_current(spark, current, variant.keys)
    say(f"{variant.label}: loaded in {load_seconds:.1f} s, {file_count(spark, current)} files")
    previous = {k: spark.conf.get(k, None) for k in variant.conf}
    for key, value in variant.conf.items():
        spark.conf.set(key, value)
    runs: list[dict[str, Any]] = []
    existing = variant.keys
    try:
        for index in range(batches):
            events = events_batch(spark, index, existing, variant.batch, (index + 1) * 10**10)
            events = events.select(*[*spec.silver.columns(), *EVENT_METADATA]).persist()
            events.count()
            if history:  # the stage appends the batch's events before the history MERGE
                events.write.format("delta").mode("append").save(stage.events_path)
            started = time.monotonic()
            writes = stage._merge_history(events, index) if history else stage._merge(events, index)
            seconds = time.monotonic() - started
            events.unpersist()
            metrics = last_metrics(spark, current)
            existing += int(variant.batch * NEW_FRACTION)
            run = {
                "batch": index,
                "seconds": round(seconds, 3),
                "upserts_per_second": round(variant.batch / seconds, 1),
                "table_rows_before": existing - int(variant.batch * NEW_FRACTION),
                "writes": [w.to_dict() for w in writes],
                "inserted": int(metrics.get("numTargetRowsInserted", 0)),
                "updated": int(metrics.get("numTargetRowsUpdated", 0)),
                "files_added": int(metrics.get("numTargetFilesAdded", 0)),
                "files_removed": int(metrics.get("numTargetFilesRemoved", 0)),
                "dv_added": int(metrics.get("numTargetDeletionVectorsAdded", 0)),
                "bytes_added": int(metrics.get("numTargetBytesAdded", 0)),
                "scan_ms": int(metrics.get("scanTimeMs", 0)),
                "rewrite_ms": int(metrics.get("rewriteTimeMs", 0)),
            }
            updates = variant.batch - int(variant.batch * NEW_FRACTION)
            # history: an update closes a version (updated) and opens one (inserted)
            expected = (
                updates,
                int(variant.batch * NEW_FRACTION) + (updates if history else 0),
            )
            if (run["updated"], run["inserted"]) != expected:
                raise SystemExit(
                    f"MERGE changed {run['updated']} / inserted {run['inserted']}, expected {expected}"
                )
            print(BATCH_PREFIX + json.dumps({"variant": variant.label, **run}), flush=True)
            runs.append(run)
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    files = file_count(spark, current)
    shutil.rmtree(runtime / "lake" / "silver", ignore_errors=True)  # keep the disk small
    return {
        "variant": variant.label,
        "table": variant.table,
        "keys": variant.keys,
        "batch": variant.batch,
        "deletion_vectors": variant.deletion_vectors,
        "conf": variant.conf,
        "load_seconds": round(load_seconds, 1),
        "files_after": files,
        "runs": runs,
    }


def child_main(argv: list[str]) -> int:
    from pipelines.spark import get_spark_session

    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="JSON: {batches, variants: [...]}")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan)
    spark = get_spark_session("bench-merge", ui=False)
    from pipelines.settings import load_settings

    runtime = load_settings().runtime_dir
    results = []
    for number, raw in enumerate(plan["variants"]):
        variant = Variant(
            raw["keys"], raw["batch"], raw["deletion_vectors"], raw["conf"], raw["table"]
        )
        results.append(measure(spark, runtime, number, variant, plan["batches"]))
    conf = {
        k: spark.conf.get(k)
        for k in (
            "spark.sql.shuffle.partitions",
            "spark.driver.memory",
            "spark.sql.adaptive.enabled",
            "spark.databricks.delta.snapshotPartitions",
        )
    }
    print(RESULT_PREFIX + json.dumps({"results": results, "session_conf": conf}), flush=True)
    spark.stop()
    return 0


# --------------------------------------------------------------------------- harness side


def parse_conf(items: list[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BenchError(f"--merge-conf takes KEY=VALUE, not {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def plan_of(
    keys: list[int],
    batches_sizes: list[int],
    dv_modes: list[bool],
    confs: list[dict[str, str]],
    tables: tuple[str, ...] = ("current",),
) -> list[Variant]:
    return [
        Variant(k, b, dv, c, t)
        for t in tables
        for k in keys
        for b in batches_sizes
        for c in confs
        for dv in dv_modes
        if b * (1 - NEW_FRACTION) <= k
    ]


def run_merge_throughput(
    workdir: Path, jars_dir: Path, variants: list[Variant], batches: int
) -> Outcome:
    runtime = workdir / "merge"
    plan = {"batches": batches, "variants": [v.__dict__ for v in variants]}
    env = conflux_env(runtime, jars_dir)
    command = [PYTHON, str(BENCH_DIR / "merge.py"), "--plan", json.dumps(plan)]
    log = workdir / "merge.log"
    say(f"merge_throughput: {len(variants)} table(s), {batches} batches each; log {log}")
    with Child(command, env, log) as child:
        child.wait_ok(6 * 3600)
        report = last_json_line(child.output(), RESULT_PREFIX)
    return _outcome(report, batches)


def _stats(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    values = [float(r[key]) for r in runs]
    return min(values), median(values), max(values)


def _outcome(report: dict[str, Any], batches: int) -> Outcome:
    rows: list[Row] = []
    results = report["results"]
    for result in results:
        lo, mid, hi = _stats(result["runs"], "upserts_per_second")
        s_lo, s_mid, s_hi = _stats(result["runs"], "seconds")
        last = result["runs"][-1]
        how = (f"DV added {last['dv_added']}, " if result["deletion_vectors"] else "") + (
            f"files +{last['files_added']}/-{last['files_removed']}, "
            f"{last['bytes_added'] / 1e6:,.0f} MB written, scan {last['scan_ms'] / 1000:.1f} s, "
            f"rewrite {last['rewrite_ms'] / 1000:.1f} s (last batch)"
        )
        rows.append(
            Row(
                "merge_throughput",
                f"{result['variant']}: upserts/s min / median / max",
                f"{lo:,.0f} / {mid:,.0f} / {hi:,.0f}",
                f"{batches} batches of {s_lo:.1f} / {s_mid:.1f} / {s_hi:.1f} s; {how}; "
                f"initial load {result['load_seconds']} s",
            )
        )
    rows += _ratios(results)
    extra = _every_batch(results)
    return Outcome(rows, report, extra)


def _median_seconds(result: dict[str, Any]) -> float:
    return median([float(r["seconds"]) for r in result["runs"]])


def _ratios(results: list[dict[str, Any]]) -> list[Row]:
    rows = []
    by = {
        (r["keys"], r["batch"], r["deletion_vectors"], json.dumps(r["conf"]), r.get("table")): r
        for r in results
    }
    for (keys, batch, dv, conf, table), result in by.items():
        if dv and (keys, batch, False, conf, table) in by:
            plain = by[(keys, batch, False, conf, table)]
            rows.append(
                Row(
                    "merge_throughput",
                    f"DV / no DV, {table}, {keys:,} keys, batch {batch:,}"
                    + (f", {conf}" if conf != "{}" else ""),
                    f"{_median_seconds(plain) / _median_seconds(result):.2f}x upserts/s",
                    "median batch times",
                )
            )
    sizes = sorted({r["keys"] for r in results})
    for (keys, batch, dv, conf, table), result in by.items():
        if keys == sizes[0] or (sizes[0], batch, dv, conf, table) not in by:
            continue
        small = by[(sizes[0], batch, dv, conf, table)]
        rows.append(
            Row(
                "merge_throughput",
                f"{table} batch time {keys:,} / {sizes[0]:,} keys, batch {batch:,}, "
                f"{'DV' if dv else 'no DV'}",
                f"{_median_seconds(result) / _median_seconds(small):.2f}x",
                f"table {keys / sizes[0]:.0f}x larger; median batch times",
            )
        )
    return rows


def _every_batch(results: list[dict[str, Any]]) -> str:
    lines = [
        "| table | batch | seconds | upserts/s | updated | inserted | files +/- | DVs | MB written | scan s | rewrite s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for r in result["runs"]:
            lines.append(
                f"| {result['variant']} | {r['batch']} | {r['seconds']:.1f} | "
                f"{r['upserts_per_second']:,.0f} | {r['updated']:,} | {r['inserted']:,} | "
                f"{r['files_added']}/{r['files_removed']} | {r['dv_added']} | "
                f"{r['bytes_added'] / 1e6:,.0f} | {r['scan_ms'] / 1000:.1f} | {r['rewrite_ms'] / 1000:.1f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

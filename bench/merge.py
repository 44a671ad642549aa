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
   of ``batch`` change events: 20 % inserts of new keys, 80 % updates of existing keys, each
   updated key changed ``changes_per_key`` times in the batch (so ``reduce_batch`` has work).
   The updated keys (distinct, a multiplicative permutation of a key range) are spread over the
   whole key space (shape ``uniform``: every file is touched) or, in the common CDC shape
   ``recent``, 80 % of them among the 10 % most recently inserted keys (the highest ids) and the
   rest among the older ones. The batch is persisted and counted first (in the stage the parsed
   batch is persisted too), then ``stage._merge`` runs ``reduce_batch`` + ``drop_deleted`` +
   ``merge_current`` under ``idempotent_session`` (and, as in the stage for a batch without
   deletes, no deleted-keys MERGE); only that call is timed;
4. every ``optimize_every`` batches the table is compacted by maintenance's own OPTIMIZE
   (:func:`pipelines.maintenance.run_optimize`), timed and counted in the throughput; after the
   last batch the table's file count and a full read of it with delta-rs (the reader a user's
   non-Spark consumer would use, deletion vectors applied) are reported beside it, so no cost is
   pushed onto readers unseen.

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
    conflux_env,
    last_json_line,
    say,
)
from bench.merge_report import outcome_of

RESULT_PREFIX = "bench.merge "
BATCH_PREFIX = "bench.merge.batch "
SCHEMA_DDL = "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP"
#: A prime coprime to every key count used (powers of 2 and 5 times small numbers): ``i * P mod n``
#: visits distinct keys spread over the whole key space.
PERMUTE = 2_654_435_761
NEW_FRACTION = 0.2
#: Shape ``recent``: this share of the updated keys among this fraction of the newest keys.
RECENT_SHARE = 0.8
RECENT_FRACTION = 0.1
SHAPES = ("uniform", "recent")


@dataclass(frozen=True)
class Variant:
    """One table to measure: its size, whether it uses deletion vectors, extra session confs."""

    keys: int
    batch: int
    deletion_vectors: bool
    conf: dict[str, str]
    table: str = "current"
    shape: str = "uniform"
    changes_per_key: int = 1
    optimize_every: int = 0

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.conf.items())
        dv = "DV" if self.deletion_vectors else "no DV"
        how = f"{self.shape}, {self.changes_per_key} changes/key"
        if self.optimize_every:
            how += f", OPTIMIZE every {self.optimize_every}"
        return f"{self.table}: {self.keys:,} keys, batch {self.batch:,}, {dv}, {how}" + (
            f", {extra}" if extra else ""
        )

    @property
    def inserts(self) -> int:
        """New keys per batch."""
        return int(self.batch * NEW_FRACTION)

    @property
    def updated_keys(self) -> int:
        """Existing keys a batch updates (each ``changes_per_key`` times)."""
        return (self.batch - self.inserts) // self.changes_per_key

    @property
    def events(self) -> int:
        """Change events per batch."""
        return self.inserts + self.updated_keys * self.changes_per_key


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


def _values(frame: Any, key: Any, version: Any = 0, carry: tuple[str, ...] = ()) -> Any:
    """Customers as the schema's columns (then ``carry``, columns of ``frame`` kept);
    ``version`` (an int or a column) goes into the name."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    tiers = F.array(*(F.lit(t) for t in ("free", "silver", "gold", "platinum")))
    tag = version if isinstance(version, Column) else F.lit(version)
    return frame.select(
        key.alias("id"),
        F.concat(F.lit("Customer "), key.cast("string"), F.lit(" v"), tag.cast("string")).alias(
            "name"
        ),
        F.concat(F.lit("c"), key.cast("string"), F.lit("@example.com")).alias("email"),
        F.element_at(tiers, (key % 4 + 1).cast("int")).alias("tier"),
        F.current_timestamp().alias("updated_at"),
        *carry,
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


def updated_key(j: Any, count: int, existing: int, offset: int, shape: str) -> Any:
    """The ``j``-th (0 <= j < ``count``) existing key a batch updates: distinct for distinct j."""
    from pyspark.sql import functions as F

    if shape == "uniform":
        return (j * PERMUTE + offset) % existing
    recent = max(1, int(existing * RECENT_FRACTION))
    hot = int(count * RECENT_SHARE)
    if hot > recent or count - hot > existing - recent:
        raise SystemExit(f"{count:,} updated keys do not fit the recent shape of {existing:,}")
    older = existing - recent
    return F.when(j < hot, older + (j * PERMUTE + offset) % recent).otherwise(
        ((j - hot) * PERMUTE + offset) % F.lit(max(1, older))
    )


def events_batch(
    spark: Any, index: int, existing: int, variant: Variant, first_sequence: int
) -> Any:
    """One batch of change events (see the module doc, 3.): updates first, then inserts."""
    from pyspark.sql import functions as F

    per_key, count = variant.changes_per_key, variant.updated_keys
    if count > existing:
        raise SystemExit(f"a batch updating {count:,} keys needs that many existing keys")
    updates = count * per_key
    offset = index * 7_919 % existing
    picks = spark.range(0, variant.events, 1, 4).withColumnRenamed("id", "_i")
    i = F.col("_i")  # the row number: updates first, each key's changes in a row
    updated = updated_key(F.floor(i / per_key), count, existing, offset, variant.shape)
    key = F.when(i < updates, updated).otherwise(existing + i - updates)
    version = F.lit(index * per_key + 1) + F.when(i < updates, i % per_key).otherwise(0)
    frame = _values(picks, key, version, carry=("_i",))
    return change_events(
        frame,
        updates,
        sequence=F.lit(first_sequence) + F.col("_i"),
        source_partition=F.col("_i") % 3,
        source_offset=F.lit(index * variant.batch) + F.col("_i"),
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


def _prepared(spark: Any, number: int, variant: Variant) -> tuple[Any, str, float]:
    """The stage of a fresh flow, its tables created as the stage does and the measured one
    loaded: (stage, that table's path, seconds the load took)."""
    from pipelines.catalog.state import FlowState
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.settings import load_settings
    from pipelines.stages.silver import SilverStage

    settings = load_settings()
    spec = flow_spec(f"merge{number}", variant.table)
    locations = FlowState.of(spec, settings)
    write_identity(locations, FlowIdentity.new(spec, locations))
    stage = SilverStage(spec, settings, None, lambda _commit: None)
    stage.prepare(spark)
    history = variant.table == "history"
    path = stage.history_path if history else stage.current_path
    assert path is not None
    dv = "true" if variant.deletion_vectors else "false"
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = '{dv}')"
    )
    if history:
        load_seconds = load_history(spark, stage.events_path, path, variant.keys)
    else:
        load_seconds = load_current(spark, path, variant.keys)
    say(f"{variant.label}: loaded in {load_seconds:.1f} s, {file_count(spark, path)} files")
    return stage, path, load_seconds


def _timed_batch(
    stage: Any, spark: Any, variant: Variant, index: int, existing: int
) -> tuple[float, list[Any]]:
    """One batch through the stage's MERGE path: (seconds of that call only, its writes)."""
    from pipelines.silver.parse import EVENT_METADATA

    history = variant.table == "history"
    events = events_batch(spark, index, existing, variant, (index + 1) * 10**10)
    events = events.select(*[*stage.silver.columns(), *EVENT_METADATA]).persist()
    events.count()
    if history:  # the stage appends the batch's events before the history MERGE
        events.write.format("delta").mode("append").save(stage.events_path)
    started = time.monotonic()
    # no deletes in the batch: the stage skips the deleted-keys MERGE, so does this
    writes = stage._merge_history(events, index) if history else stage._merge(events, index, False)
    seconds = time.monotonic() - started
    events.unpersist()
    return seconds, writes


def measure(
    spark: Any, runtime: Path, number: int, variant: Variant, batches: int
) -> dict[str, Any]:
    """Create the stage's tables, load the measured one, MERGE ``batches`` batches into it
    (OPTIMIZE on its schedule), then count its files and read it with delta-rs."""
    from pipelines.catalog.roles import TableRole
    from pipelines.delta_writes import session_confs

    stage, path, load_seconds = _prepared(spark, number, variant)
    history = variant.table == "history"
    table = stage.written[TableRole.HISTORY if history else TableRole.CURRENT][0]
    runs: list[dict[str, Any]] = []
    optimizations: list[dict[str, Any]] = []
    existing = variant.keys
    with session_confs(spark, variant.conf):
        for index in range(batches):
            seconds, writes = _timed_batch(stage, spark, variant, index, existing)
            run = _batch_run(spark, path, variant, index, seconds, existing, history)
            run["writes"] = [w.to_dict() for w in writes]
            existing += variant.inserts
            print(BATCH_PREFIX + json.dumps({"variant": variant.label, **run}), flush=True)
            runs.append(run)
            if variant.optimize_every and (index + 1) % variant.optimize_every == 0:
                optimizations.append(_optimize(spark, table, index))
    files = file_count(spark, path)
    read = delta_rs_read(path)
    shutil.rmtree(runtime / "lake" / "silver", ignore_errors=True)  # keep the disk small
    return {
        **{k: getattr(variant, k) for k in ("table", "keys", "batch", "shape", "conf")},
        "variant": variant.label,
        "events_per_batch": variant.events,
        "changes_per_key": variant.changes_per_key,
        "deletion_vectors": variant.deletion_vectors,
        "load_seconds": round(load_seconds, 1),
        "files_after": files,
        "optimizations": optimizations,
        "delta_rs_read": read,
        "runs": runs,
    }


def _batch_run(
    spark: Any,
    path: str,
    variant: Variant,
    index: int,
    seconds: float,
    existing: int,
    history: bool,
) -> dict[str, Any]:
    """One batch's figures from the MERGE's own metrics, checked against what it must have done."""
    metrics = last_metrics(spark, path)
    run = {
        "batch": index,
        "seconds": round(seconds, 3),
        "upserts_per_second": round(variant.events / seconds, 1),
        "table_rows_before": existing,
        "inserted": int(metrics.get("numTargetRowsInserted", 0)),
        "updated": int(metrics.get("numTargetRowsUpdated", 0)),
        "files_added": int(metrics.get("numTargetFilesAdded", 0)),
        "files_removed": int(metrics.get("numTargetFilesRemoved", 0)),
        "dv_added": int(metrics.get("numTargetDeletionVectorsAdded", 0)),
        "bytes_added": int(metrics.get("numTargetBytesAdded", 0)),
        "scan_ms": int(metrics.get("scanTimeMs", 0)),
        "rewrite_ms": int(metrics.get("rewriteTimeMs", 0)),
    }
    # current: one row per updated key; history: each change of an updated key opens a version
    # (every change renames the customer) and the key's open version is closed
    opened = variant.updated_keys * variant.changes_per_key if history else 0
    expected = (variant.updated_keys, variant.inserts + opened)
    if (run["updated"], run["inserted"]) != expected:
        raise SystemExit(
            f"{variant.label}: MERGE of batch {index} updated {run['updated']} / inserted "
            f"{run['inserted']}, expected {expected}"
        )
    return run


def _optimize(spark: Any, table: Any, index: int) -> dict[str, Any]:
    """Maintenance's OPTIMIZE of the table, timed (it runs on the stream's schedule)."""
    from pipelines.maintenance import run_optimize

    started = time.monotonic()
    files = run_optimize(spark, table)
    seconds = round(time.monotonic() - started, 3)
    say(f"OPTIMIZE after batch {index}: {seconds} s, files -{files['removed']} +{files['added']}")
    return {"after_batch": index, "seconds": seconds, **files}


def delta_rs_read(path: str) -> dict[str, Any]:
    """A full read of the table with delta-rs, deletion vectors applied: rows and seconds. Its
    ``QueryBuilder`` (DataFusion), as a user's non-Spark reader would: the plain
    ``to_pyarrow_table`` refuses tables with the deletion-vectors feature."""
    import pyarrow as pa
    from deltalake import DeltaTable as RsTable
    from deltalake import QueryBuilder

    started = time.monotonic()
    try:
        builder = QueryBuilder().register("t", RsTable(path))
        rows = pa.table(builder.execute("SELECT * FROM t").read_all()).num_rows
    except Exception as error:  # the figure a reader would get: that it cannot read the table
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {"rows": rows, "seconds": round(time.monotonic() - started, 3)}


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
        variant = Variant(**raw)
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
    shapes: tuple[str, ...] = ("uniform",),
    changes_per_key: int = 1,
    optimize_every: int = 0,
) -> list[Variant]:
    return [
        Variant(k, b, dv, c, t, shape, changes_per_key, optimize_every)
        for t in tables
        for shape in shapes
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
    return outcome_of(report, batches)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

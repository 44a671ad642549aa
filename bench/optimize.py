"""``optimize_reads``: read time of a current-state table before and after OPTIMIZE.

A current-state table fed by a stream is built by many small MERGE batches, each adding files of
its own (with deletion vectors, updated rows land in new files and the old ones get a vector; the
inserts always do), so readers open more and more small files. This benchmark builds such a table
through the real code path and measures what OPTIMIZE gives back. The harness side
(:func:`run_optimize_reads`) runs this file as a child process (the harness has no JVM), which:

1. builds the silver stage of a Debezium flow (``current`` keyed by ``id``, the ``customers``
   schema of :mod:`bench.merge`) and creates its tables with ``stage.prepare``, deletion vectors
   on or off on the current table;
2. MERGEs ``batches`` batches of ``batch`` upserts into it with ``stage._merge`` (what each
   micro-batch of the stage does): the first batch inserts, every later one half updates of keys
   spread over the table, half new keys;
3. measures, ``reads`` times each, a full scan (count and a hash of every row: every file is
   opened and every column decoded) and point lookups of single keys (a data-skipping read), after
   one warm-up of each;
4. runs OPTIMIZE as table maintenance does (:func:`pipelines.maintenance.maintain_table`), checks
   that the table holds the same rows (count and hash), and measures the reads again.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Outcome, Row, median, run_plan_child, say, serve_plan_child

RESULT_PREFIX = "bench.optimize "
LOOKUPS = 5


@dataclass(frozen=True)
class Plan:
    batches: int
    batch: int
    reads: int
    deletion_vectors: tuple[bool, ...]

    @property
    def keys(self) -> int:
        return self.batch + (self.batches - 1) * (self.batch // 2)


# --------------------------------------------------------------------------- child (Spark) side


def upserts(spark: Any, index: int, existing: int, batch: int) -> Any:
    """One batch of events: all inserts at first, then half updates (spread keys), half inserts."""
    from pyspark.sql import functions as F

    from bench.merge import PERMUTE, _values, change_events

    inserts = batch if existing == 0 else batch // 2
    updates = batch - inserts
    picks = spark.range(0, batch, 1, 2)
    i = F.col("id")
    offset = index * 7_919 % max(existing, 1)
    key = F.when(i < updates, (i * PERMUTE + offset) % max(existing, 1)).otherwise(
        existing + i - updates
    )
    frame = _values(picks.withColumn("_i", i), key).withColumn("_i", i)
    return change_events(
        frame,
        updates,
        sequence=F.lit((index + 1) * 10**10) + F.col("_i"),
        source_partition=F.lit(0),
        source_offset=F.col("_i"),
        batch_id=index,
    )


def full_scan(spark: Any, path: str) -> tuple[int, int]:
    """(rows, XOR of a hash of every row's columns): reads every file and every column; the same
    rows give the same pair in any file layout."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    row = frame.agg(F.count("*"), F.bit_xor(F.xxhash64(*frame.columns))).first()
    return int(row[0]), int(row[1] or 0)


def lookup(spark: Any, path: str, key: int) -> int:
    from pyspark.sql import functions as F

    return len(spark.read.format("delta").load(path).where(F.col("id") == key).collect())


def timed(run: Any) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


def measure_reads(spark: Any, path: str, keys: int, reads: int) -> dict[str, Any]:
    """Median seconds of a full scan and of one point lookup, after one warm-up of each."""
    probes = [key * keys // LOOKUPS for key in range(LOOKUPS)]
    full_scan(spark, path)
    lookup(spark, path, probes[0])
    scans = [timed(lambda: full_scan(spark, path)) for _ in range(reads)]
    lookups = [
        timed(lambda key=key: lookup(spark, path, key)) for _ in range(reads) for key in probes
    ]
    return {
        "full_scan_seconds": round(median(scans), 3),
        "lookup_seconds": round(median(lookups), 3),
        "full_scans": [round(s, 3) for s in scans],
    }


def measure(spark: Any, number: int, plan: Plan, deletion_vectors: bool) -> dict[str, Any]:
    from bench.merge import flow_spec
    from pipelines.catalog.roles import TableRole
    from pipelines.catalog.state import FlowState
    from pipelines.identity import FlowIdentity, write_identity
    from pipelines.maintenance import describe, flow_tables, maintain_table
    from pipelines.settings import load_settings
    from pipelines.silver.parse import EVENT_METADATA
    from pipelines.stages.silver import SilverStage

    settings = load_settings()
    spec = flow_spec(f"optimize{number}")
    locations = FlowState.of(spec, settings)
    write_identity(locations, FlowIdentity.new(spec, locations))
    stage = SilverStage(spec, settings, None, lambda _commit: None)
    stage.prepare(spark)
    path = stage.current_path
    assert path is not None and spec.silver is not None
    flag = "true" if deletion_vectors else "false"
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = '{flag}')"
    )
    columns = [*spec.silver.columns(), *EVENT_METADATA]
    existing = 0
    started = time.monotonic()
    for index in range(plan.batches):
        events = upserts(spark, index, existing, plan.batch).select(*columns).persist()
        events.count()
        stage._merge(events, index)
        events.unpersist()
        existing += plan.batch if existing == 0 else plan.batch // 2
        if (index + 1) % 50 == 0:
            say(f"{plan.batches} batches, DV {flag}: {index + 1} merged")
    build_seconds = time.monotonic() - started
    before = describe(spark, settings.location(path))
    content = full_scan(spark, path)
    if content[0] != existing:
        raise SystemExit(f"the table holds {content[0]} rows, expected {existing}")
    reads_before = measure_reads(spark, path, existing, plan.reads)
    [table] = [t for t in flow_tables(spec, settings) if t.role is TableRole.CURRENT]
    report = maintain_table(spark, spec, table, [], do_optimize=True, do_vacuum=False)
    if not report.ok:
        raise SystemExit(f"OPTIMIZE failed: {report.errors}")
    if full_scan(spark, path) != content:
        raise SystemExit("OPTIMIZE changed the table's rows")
    reads_after = measure_reads(spark, path, existing, plan.reads)
    return {
        "deletion_vectors": deletion_vectors,
        "batches": plan.batches,
        "batch": plan.batch,
        "rows": existing,
        "build_seconds": round(build_seconds, 1),
        "files_before": before.files,
        "bytes_before": before.bytes,
        "files_after": report.files_after,
        "bytes_after": report.bytes_after,
        "optimize_seconds": report.seconds,
        "before": reads_before,
        "after": reads_after,
    }


def child_main(argv: list[str]) -> int:
    def measure_all(spark: Any, raw: dict[str, Any]) -> dict[str, Any]:
        plan = Plan(raw["batches"], raw["batch"], raw["reads"], tuple(raw["deletion_vectors"]))
        return {
            "results": [measure(spark, n, plan, dv) for n, dv in enumerate(plan.deletion_vectors)]
        }

    return serve_plan_child(argv, "optimize", RESULT_PREFIX, measure_all)


# --------------------------------------------------------------------------- harness side


def run_optimize_reads(workdir: Path, jars_dir: Path, plan: Plan) -> Outcome:
    say(
        f"optimize_reads: {plan.batches} MERGE batches of {plan.batch:,} upserts "
        f"({plan.keys:,} keys), DV {list(plan.deletion_vectors)}; log {workdir / 'optimize.log'}"
    )
    report = run_plan_child("optimize", plan, workdir, jars_dir, RESULT_PREFIX)
    return Outcome(_rows(report["results"]), report)


def _rows(results: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for r in results:
        table = (
            f"{r['rows']:,} keys from {r['batches']} MERGE batches of {r['batch']:,}, "
            f"{'DV' if r['deletion_vectors'] else 'no DV'}"
        )
        files = (
            f"{r['files_before']:,} files ({r['bytes_before'] / 1e6:,.1f} MB) -> "
            f"{r['files_after']:,} ({r['bytes_after'] / 1e6:,.1f} MB)"
        )
        for metric, key in (("full scan", "full_scan_seconds"), ("point lookup", "lookup_seconds")):
            before, after = r["before"][key], r["after"][key]
            rows.append(
                Row(
                    "optimize_reads",
                    f"{table}: {metric} s before / after OPTIMIZE",
                    f"{before:.2f} / {after:.2f} ({before / after:.1f}x)",
                    f"{files}; median of the reads",
                )
            )
        rows.append(
            Row(
                "optimize_reads",
                f"{table}: OPTIMIZE",
                f"{r['optimize_seconds']:.1f} s",
                f"{files}; building the table took {r['build_seconds']} s",
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

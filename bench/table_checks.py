"""Spark-side checks of the benchmark tables, run in a child process (the harness has no JVM).

* ``count --table PATH ...``: rows and distinct Kafka coordinates of each table; prints
  ``bench.counts {json}``.
* ``latency --table PATH``: per-row latency from ``produced_ms`` in the payload to the Delta commit
  that made the row visible; prints ``bench.latency {json}`` with percentiles.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.delta_commits import Commit, commits_by_file, file_name
from pipelines.spark import get_spark_session

PERCENTILES = (50, 95, 99)


def count_tables(spark: SparkSession, tables: list[str]) -> dict[str, dict[str, int]]:
    counts = {}
    for path in tables:
        frame = spark.read.format("delta").load(path)
        counts[path] = {
            "rows": frame.count(),
            "distinct_offsets": frame.select("topic", "partition", "offset").distinct().count(),
        }
    return counts


def latency_rows(spark: SparkSession, table: str) -> list[tuple[str, float, float]]:
    """(data file, produced ms, ingested_at ms) of every measured (non warm-up) row."""
    payload = F.col("value").cast("string")
    frame = (
        spark.read.format("delta")
        .load(table)
        .select(
            F.col("_metadata.file_path").alias("file"),
            F.get_json_object(payload, "$.seq").cast("long").alias("seq"),
            F.get_json_object(payload, "$.produced_ms").cast("double").alias("produced_ms"),
            (F.unix_micros("ingested_at") / 1000).alias("ingested_ms"),
        )
        .where("seq >= 0")
    )
    return [(r.file, r.produced_ms, r.ingested_ms) for r in frame.collect()]


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    summary = {f"p{p}": round(percentile(ordered, p), 1) for p in PERCENTILES}
    summary.update(max=round(ordered[-1], 1), min=round(ordered[0], 1))
    summary["mean"] = round(sum(ordered) / len(ordered), 1)
    return summary


def latency_report(spark: SparkSession, table: str) -> dict[str, Any]:
    """Latency percentiles (ms), produce → commit and its two parts split at the batch start."""
    commits = commits_by_file(Path(table))
    samples = [(commits[file_name(f)], p, i) for f, p, i in latency_rows(spark, table)]
    if not samples:
        raise SystemExit(f"{table}: no measured rows")

    def metric(value: Callable[[Commit, float, float], float]) -> dict[str, float]:
        return summarize([value(c, p, i) for c, p, i in samples])

    return {
        "count": len(samples),
        "commits": len({c.version for c, _, _ in samples}),
        "visible_ms": metric(lambda c, p, _i: c.timestamp_ms - p),
        "log_file_mtime_ms": metric(lambda c, p, _i: c.file_mtime_ms - p),
        "wait_for_batch_ms": metric(lambda _c, p, i: i - p),
        "batch_start_to_commit_ms": metric(lambda c, _p, i: c.timestamp_ms - i),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("count", "latency"))
    parser.add_argument("--table", action="append", required=True)
    args = parser.parse_args()
    spark = get_spark_session("bench-table-checks")
    if args.command == "count":
        print("bench.counts " + json.dumps(count_tables(spark, args.table)), flush=True)
    else:
        print("bench.latency " + json.dumps(latency_report(spark, args.table[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Child of the ``store`` benchmark: small Delta appends to a local table and an ``s3a://`` one.

One Spark session (Conflux's: the S3A connector, Conflux's conditional log store for ``s3a``)
appends ``rows`` rows, one data file, to each table in turn, ``warmup`` + ``commits`` times; the
order alternates every round so neither table always goes first. Each append's wall time is
``DataFrameWriter.save`` from call to return: write the data file, read the log's new entries,
create ``_delta_log/N.json`` (on S3: one conditional PUT). The first ``warmup`` rounds (table
creation, JIT) are not kept. Also counts S3A's HTTP requests over the measured appends.

Prints one ``bench.store_commits {json}`` line. Run by bench/store.py through
:func:`bench.harness.run_plan_child`; the store's credentials come from the environment.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import serve_plan_child

RESULT = "bench.store_commits "


def s3a_requests(spark: Any, uri: str) -> dict[str, int]:
    """S3A's request counters (``*_request``) of the file system that holds ``uri``; empty if
    this Hadoop does not expose them."""
    try:
        jvm = spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(uri)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        counters = fs.getIOStatistics().counters()
        names = [str(name) for name in counters.keySet().toArray()]
    except Exception:  # py4j's errors: the counters are a detail, not the measurement
        return {}
    return {n: int(counters.get(n)) for n in names if n.endswith("_request") and "." not in n}


def measure(spark: Any, plan: dict[str, Any]) -> dict[str, Any]:
    rows = spark.range(plan["rows"]).selectExpr("id", "uuid() AS note").coalesce(1)
    tables = {"local": plan["local_table"], "store": plan["store_table"]}
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    before: dict[str, int] = {}
    for round_ in range(plan["warmup"] + plan["commits"]):
        if round_ == plan["warmup"]:
            before = s3a_requests(spark, tables["store"])
        order = list(tables) if round_ % 2 == 0 else list(reversed(tables))
        for name in order:
            started = time.perf_counter()
            rows.write.format("delta").mode("append").save(tables[name])
            elapsed = time.perf_counter() - started
            if round_ >= plan["warmup"]:
                seconds[name].append(elapsed)
    after = s3a_requests(spark, tables["store"])
    requests = {n: after[n] - before.get(n, 0) for n in after if after[n] - before.get(n, 0)}
    return {"seconds": seconds, "s3a_requests": requests}


def main(argv: list[str] | None = None) -> int:
    return serve_plan_child(
        sys.argv[1:] if argv is None else argv, "store-commits", RESULT, measure
    )


if __name__ == "__main__":
    sys.exit(main())

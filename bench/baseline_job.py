"""``spark_default`` of ``bronze_throughput``: the minimal Kafka → Delta PySpark job a user writes.

Spark's defaults, not Conflux's tuned settings: only what Delta's quick start asks for (its SQL
extension and catalog) and the jars (Delta, the Kafka connector; the same local files Conflux
uses, so no runner downloads anything). Read the topic, write the raw Kafka columns to a Delta
table, availableNow, then exit. ``maxOffsetsPerTrigger`` is set only so every runner commits the
same number of records at a time. Prints ``baseline: query started`` when the query runs and one
``bench.baseline {json}`` line at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import SparkSession

from pipelines.jvm import require_jars
from pipelines.settings import load_settings
from pipelines.spark import DELTA_CONF


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", type=int, required=True)
    return parser.parse_args()


def build_session() -> SparkSession:
    jars = require_jars(load_settings().spark_jars_dir, "Spark (Delta + Kafka connector)")
    builder = SparkSession.builder.appName("bench-spark-default")
    builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    for key, value in DELTA_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> int:
    args = parse_args()
    spark = build_session()
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start(args.table)
    )
    print("baseline: query started", flush=True)
    query.awaitTermination()
    batches = [
        {"batch_id": p.batchId, "input_rows": p.numInputRows, "batch_duration_ms": p.batchDuration}
        for p in query.recentProgress
    ]
    print("bench.baseline " + json.dumps({"batches": batches}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

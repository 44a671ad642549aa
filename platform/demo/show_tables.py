"""Print what the demo wrote: row counts, a sample and the Delta history of each bronze table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipelines.locations import FlowLocations
from pipelines.settings import load_settings
from pipelines.spark import get_spark_session
from pipelines.spec import load_specs


def main() -> int:
    settings = load_settings()
    spark = get_spark_session("conflux-show-tables", settings, ui=False)
    for spec in load_specs(settings.flows_dir):
        path = str(FlowLocations.of(spec, settings).table)
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
        sample.show(5, truncate=70)
        if "_rescued_data" in table.columns:
            rescued = table.where(F.col("_rescued_data").isNotNull())
            print(
                f"rows with _rescued_data (fields that did not fit the stored schema): {rescued.count()}"
            )
            rescued.select("order_id", "amount", "_rescued_data").show(5, truncate=70)
        DeltaTable.forPath(spark, path).history(5).select(
            "version", "timestamp", "operation", "operationMetrics.numOutputRows"
        ).show(truncate=False)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Gold backfills in Dagster: one daily-partitioned asset per gold table.

``backfill/<gold table>`` recomputes event dates of the gold table from the silver events, late
rows included (:func:`pipelines.gold.backfill.backfill`), on dagster-pyspark's ``pyspark``
resource: short Spark work in the run's own process, beside the flow's stream (its own pool,
``conflux/backfill/<flow>``, not the flow's). Its partitions are the gold table's event dates; the
single-run backfill policy makes a backfill of a date range from the UI one run and one Spark
job. A date still open under the stream's watermark fails the run with the date it closes at.
The gold table and its late-data table get an ``AssetObservation`` of what the backfill did.

The gold table itself stays in the flow's unpartitioned multi-asset (a stream writes all its
dates at once); this asset is where its dates are rebuilt.
"""

from datetime import date, datetime
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    BackfillPolicy,
    DailyPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import PySparkResource

from assets.keys import flow_table_keys, gold_input_keys
from pipelines.gold.backfill import BackfillRefusedError, backfill
from pipelines.settings import Settings
from pipelines.spec import AnyGold, FlowSpec


def backfill_key(gold: AnyGold) -> AssetKey:
    return AssetKey(["backfill", gold.table])


def backfill_pool(spec: FlowSpec) -> str:
    return f"conflux/backfill/{spec.name}"


def _date(partition_key: str) -> date:
    return datetime.strptime(partition_key, "%Y-%m-%d").date()


def backfill_asset(spec: FlowSpec, gold: AnyGold, settings: Settings) -> AssetsDefinition:
    keys = flow_table_keys(spec)
    gold_key, late_key = keys[f"gold/{gold.table}"], keys[f"late/{gold.table}"]

    @asset(
        key=backfill_key(gold),
        deps=[*gold_input_keys(spec, gold), gold_key, late_key],
        partitions_def=DailyPartitionsDefinition(start_date=gold.partitions_start.isoformat()),
        backfill_policy=BackfillPolicy.single_run(),
        group_name="gold",
        kinds={"spark", "delta"},
        pool=backfill_pool(spec),
        description=f"Backfills of gold {gold.table} (flow {spec.name}): each event date "
        "recomputed from the silver events, late rows included; closed dates only.",
        metadata={"flow": spec.name, "gold_table": gold.table, "spec_file": spec.spec_file},
    )
    def _backfill(context: AssetExecutionContext, pyspark: PySparkResource) -> MaterializeResult:
        keys_range = context.partition_key_range
        first, last = _date(keys_range.start), _date(keys_range.end)
        try:
            result = backfill(pyspark.spark_session, spec, settings, gold.table, first, last)
        except BackfillRefusedError as exc:
            raise Failure(str(exc)) from exc
        metadata: dict[str, Any] = {
            "first_date": str(first),
            "last_date": str(last),
            "backfill_id": result.backfill_id,
            "gold_rows": result.gold_rows,
            "rows_reflected": result.rows_reflected,
            "late_rows_covered": result.late_rows_covered,
            "gold_version": result.gold_version if result.gold_version is not None else -1,
            "closed_until": result.closed_until,
        }
        context.log.info(f"backfill of gold {gold.table} {first}..{last}: {metadata}")
        for key in (gold_key, late_key):
            context.log_event(
                AssetObservation(
                    asset_key=key,
                    metadata={**metadata, "backfill": MetadataValue.text(f"{first}..{last}")},
                )
            )
        return MaterializeResult(metadata=metadata)

    return _backfill

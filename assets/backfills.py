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

from datetime import UTC, date, datetime, timedelta
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSelection,
    BackfillPolicy,
    DailyPartitionsDefinition,
    DefaultScheduleStatus,
    Failure,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    schedule,
)
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)
from dagster_pyspark import LazyPySparkResource

from assets.flows import flow_group, flow_tags
from assets.keys import gold_input_keys, key_of
from pipelines.catalog.roles import TableRole
from pipelines.catalog.tables import check_locations
from pipelines.gold.backfill import (
    BackfillRefusedError,
    backfill,
    closed_dates,
    refuse_open_dates,
)
from pipelines.job_progress import LOG_EVERY, JobProgress
from pipelines.settings import Settings
from pipelines.spark import prepare_session
from pipelines.spec import AnyGold, FlowSpec


def backfill_key(gold: AnyGold) -> AssetKey:
    return AssetKey(["backfill", gold.table])


def backfill_pool(spec: FlowSpec) -> str:
    return f"conflux/backfill/{spec.name}"


def _date(partition_key: str) -> date:
    return datetime.strptime(partition_key, "%Y-%m-%d").date()


def backfill_asset(spec: FlowSpec, gold: AnyGold, settings: Settings) -> AssetsDefinition:
    gold_key = key_of(spec, TableRole.GOLD, gold.table)
    late_key = key_of(spec, TableRole.LATE, gold.table)

    @asset(
        key=backfill_key(gold),
        deps=[*gold_input_keys(spec, gold), gold_key, late_key],
        partitions_def=DailyPartitionsDefinition(start_date=gold.partitions_start.isoformat()),
        backfill_policy=BackfillPolicy.single_run(),
        kinds={"spark", "delta"},
        group_name=flow_group(spec),
        owners=list(spec.owners),
        tags={**flow_tags(spec, "gold"), "conflux/kind": "backfill"},
        pool=backfill_pool(spec),
        description=f"Backfills of gold {gold.table} (flow {spec.name}): each event date "
        "recomputed from the silver events, late rows included; closed dates only.",
        metadata={"flow": spec.name, "gold_table": gold.table, "spec_file": spec.spec_file},
    )
    def _backfill(
        context: AssetExecutionContext, pyspark: LazyPySparkResource
    ) -> MaterializeResult:
        keys_range = context.partition_key_range
        first, last = _date(keys_range.start), _date(keys_range.end)
        try:
            check_locations([spec], settings)  # before Spark starts: on a cluster, no local path
            refuse_open_dates(spec, settings, gold.table, first, last)
            spark = prepare_session(pyspark.spark_session, settings)
            with JobProgress(
                spark, f"backfill {gold.table} {first}..{last}", context.log.info, LOG_EVERY
            ):
                result = backfill(spark, spec, settings, gold.table, first, last)
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


def backfill_job(gold: AnyGold) -> UnresolvedAssetJobDefinition:
    """``backfill_<table>``: the job of the backfill asset (what its schedule launches)."""
    return define_asset_job(
        f"backfill_{gold.table}",
        selection=AssetSelection.assets(backfill_key(gold)),
        description=f"Backfill event dates of gold {gold.table} (one run per date range).",
    )


def backfill_schedule(
    spec: FlowSpec, gold: AnyGold, settings: Settings, job: UnresolvedAssetJobDefinition
) -> ScheduleDefinition | None:
    """The spec's ``backfill.schedule``: one run over the last ``backfill.dates`` closed dates.

    The dates are read from the stream's watermark when the schedule ticks (no Spark), so the
    run never asks for a date the stream can still change; a tick before any date closed skips.
    The run key makes a re-evaluated tick launch nothing twice.
    """
    scheduled = gold.backfill
    if scheduled is None:
        return None

    @schedule(
        name=f"backfill_{gold.table}_schedule",
        job=job,
        cron_schedule=scheduled.schedule.strip(),
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,  # declared in the spec: wanted
        description=f"gold {gold.table} backfill.schedule of {spec.spec_file}: the last "
        f"{scheduled.dates} closed event date(s), {scheduled.schedule.strip()} (UTC)",
    )
    def _scheduled(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        dates = closed_dates(spec, settings, gold.table, scheduled.dates)
        if dates is None:
            return SkipReason(
                f"gold {gold.table}: no event date is closed yet (the stream has not passed "
                "the end of any date plus its closing delay)"
            )
        tick = context.scheduled_execution_time or datetime.now(UTC)
        # Dagster's daily partitions end yesterday: a watermark pushed ahead by future-skewed
        # events must not ask for a date that has no partition yet.
        newest = min(dates[1], tick.astimezone(UTC).date() - timedelta(days=1))
        if newest < dates[0]:
            return SkipReason(f"gold {gold.table}: the closed dates have no partition yet")
        first, last = dates[0].isoformat(), newest.isoformat()
        return RunRequest(
            run_key=f"{first}..{last}@{tick.isoformat()}",
            tags={
                ASSET_PARTITION_RANGE_START_TAG: first,
                ASSET_PARTITION_RANGE_END_TAG: last,
                "conflux/kind": "scheduled_backfill",
            },
        )

    return _scheduled

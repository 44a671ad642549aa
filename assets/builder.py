"""The one builder of Conflux's Dagster definitions: every flow spec in the flows folder.

Both the ``ConfluxFlows`` component (:mod:`assets.component`) and :mod:`assets.definitions`
(what workspace.yaml loads) build their definitions here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    AssetSpec,
    DefaultScheduleStatus,
    Definitions,
    ScheduleDefinition,
    define_asset_job,
)
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from assets.backfills import backfill_asset, backfill_job, backfill_schedule
from assets.flows import flow_assets, source_specs
from assets.health import CHECK_NAME as HEALTH_CHECK
from assets.health import health_check, stream_health_sensor
from assets.keys import bronze_key, flow_asset_keys, flow_table_keys
from assets.maintenance import maintenance_job, maintenance_schedule
from assets.resources import SparkSubmitResource, pyspark_resource
from assets.sensors import dead_run_worker_sensor
from pipelines.catalog.tables import check_distinct_tables, declared_paths
from pipelines.settings import load_settings
from pipelines.spec import FlowSpec, SpecError, load_specs
from quality.gx_checks import suite_checks


def select_flows(specs: list[FlowSpec], names: Sequence[str] | None, where: Path) -> list[FlowSpec]:
    """The specs named in ``names`` (all of them when None); a name without a spec is an error."""
    if names is None:
        return specs
    known = {spec.name for spec in specs}
    missing = [name for name in names if name not in known]
    if missing:
        raise SpecError(
            f"flows: no spec in {where} for {', '.join(missing)}; "
            f"the flows there are: {', '.join(sorted(known)) or 'none'}"
        )
    return [spec for spec in specs if spec.name in set(names)]


def flow_schedule(spec: FlowSpec, job: UnresolvedAssetJobDefinition) -> ScheduleDefinition:
    """``run_<flow>_schedule``: the spec's ``trigger.schedule`` (cron, UTC) of its run job."""
    cron = (spec.trigger.schedule or "").strip()
    return ScheduleDefinition(
        name=f"run_{spec.name}_schedule",
        job=job,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,  # declared in the spec: wanted
        description=f"trigger.schedule of {spec.spec_file}: an available_now run, {cron} (UTC)",
    )


def flow_selection(spec: FlowSpec) -> AssetSelection:
    """Every table of the flow; not a continuous flow's stream_health check, which the sensor
    keeps (a run of the flow does not execute it)."""
    tables = AssetSelection.assets(*flow_asset_keys(spec))
    if spec.trigger.mode != "continuous":
        return tables
    return tables - AssetSelection.checks(AssetCheckKey(bronze_key(spec), HEALTH_CHECK))


def build_definitions(
    flows_dir: Path | None = None, flows: Sequence[str] | None = None
) -> Definitions:
    """Assets, jobs, schedules, sensor and resources of the flow specs in ``flows_dir``.

    ``flows_dir`` defaults to the settings' (``CONFLUX_FLOWS_DIR``); ``flows`` keeps only the
    flows of those names.
    """
    settings = load_settings()
    if flows_dir is not None:
        settings = replace(settings, flows_dir=flows_dir)
    specs = select_flows(load_specs(settings.flows_dir), flows, settings.flows_dir)
    check_distinct_tables(specs, settings)
    sources: dict[AssetKey, AssetSpec] = {}
    for spec in specs:  # a topic several flows read belongs to the first of them
        for source in source_specs(spec):
            sources.setdefault(source.key, source)
    incremental = [
        key
        for spec in specs
        if spec.trigger.mode == "available_now"
        for key in flow_asset_keys(spec)
    ]
    jobs = {
        spec.name: define_asset_job(
            f"run_{spec.name}",
            selection=flow_selection(spec),
            description=f"Run flow {spec.name} ({spec.trigger.mode}).",
        )
        for spec in specs
    }
    continuous = [spec for spec in specs if spec.trigger.mode == "continuous"]
    maintenance = {spec.name: maintenance_job(spec, settings) for spec in specs}
    maintenance_schedules = [
        schedule
        for spec in specs
        if (schedule := maintenance_schedule(spec, maintenance[spec.name])) is not None
    ]
    ingest_job = define_asset_job(
        "ingest_incremental",
        selection=AssetSelection.assets(*incremental),
        description="Catch up every available_now flow, then end.",
    )
    checks = [
        check
        for spec in specs
        for check in suite_checks(
            spec,
            flow_table_keys(spec),
            {k: v.uri for k, v in declared_paths(spec, settings).items()},
        )
    ]
    backfill_jobs = {gold.table: backfill_job(gold) for spec in specs for gold in spec.gold}
    backfill_schedules = [
        schedule
        for spec in specs
        for gold in spec.gold
        if (schedule := backfill_schedule(spec, gold, settings, backfill_jobs[gold.table]))
        is not None
    ]
    return Definitions(
        assets=[
            *sources.values(),
            *(flow_assets(spec, settings) for spec in specs),
            *(backfill_asset(spec, gold, settings) for spec in specs for gold in spec.gold),
        ],
        asset_checks=[*checks, *(health_check(spec, settings) for spec in continuous)],
        jobs=[*jobs.values(), ingest_job, *maintenance.values(), *backfill_jobs.values()],
        schedules=[
            *(flow_schedule(spec, jobs[spec.name]) for spec in specs if spec.trigger.schedule),
            *maintenance_schedules,
            *backfill_schedules,
        ],
        sensors=[
            dead_run_worker_sensor(specs, settings),
            stream_health_sensor(continuous, settings),
        ],
        resources={"spark_submit": SparkSubmitResource(), "pyspark": pyspark_resource()},
    )

"""The Definitions object that workspace.yaml loads: every flow spec in the flows folder."""

from __future__ import annotations

from dagster import AssetSelection, Definitions, ScheduleDefinition, define_asset_job

from assets.flows import flow_assets, source_specs
from assets.keys import bronze_key
from assets.resources import SparkSubmitResource, pyspark_resource
from assets.sensors import dead_run_worker_sensor
from pipelines.locations import check_distinct_tables
from pipelines.settings import load_settings
from pipelines.spec import load_specs


def build_definitions() -> Definitions:
    settings = load_settings()
    specs = load_specs(settings.flows_dir)
    check_distinct_tables(specs, settings)
    sources = {s.key: s for spec in specs for s in source_specs(spec)}
    incremental = [bronze_key(s) for s in specs if s.trigger.mode == "available_now"]
    jobs = [
        define_asset_job(
            f"run_{spec.name}",
            selection=AssetSelection.assets(bronze_key(spec)),
            description=f"Run flow {spec.name} ({spec.trigger.mode}).",
        )
        for spec in specs
    ]
    ingest_job = define_asset_job(
        "ingest_incremental",
        selection=AssetSelection.assets(*incremental),
        description="Catch up every available_now flow, then end.",
    )
    return Definitions(
        assets=[*sources.values(), *(flow_assets(spec, settings) for spec in specs)],
        jobs=[*jobs, ingest_job],
        schedules=[
            ScheduleDefinition(
                name="ingest_incremental_every_15_minutes",
                job=ingest_job,
                cron_schedule="*/15 * * * *",
            )
        ],
        sensors=[dead_run_worker_sensor(specs, settings)],
        resources={"spark_submit": SparkSubmitResource(), "pyspark": pyspark_resource()},
    )


defs = build_definitions()

"""Table maintenance in Dagster: a ``maintain_<flow>`` job per flow, scheduled by its spec.

The job's one op runs :func:`pipelines.maintenance.maintain_flow` (OPTIMIZE, then VACUUM with the
slowest reader's retention) in the run's own process, on dagster-pyspark's ``pyspark`` resource:
short Spark work, unlike the flows, which run as their own applications. It reports what it did on
the flow's table assets as ``AssetObservation`` events (files, bytes and retention before and
after), so each table's page in the UI shows its maintenance history beside its materializations;
a table that failed fails the run, after every other table was maintained.

Maintenance runs beside the flow, never instead of it: the op is not in the flow's pool
(``conflux/flow/<name>``, held by a continuous run for as long as it runs) but in a pool of its
own, ``conflux/maintain/<name>`` (one slot: two maintenance runs of one flow would only race each
other's commits). A spec's ``maintenance.schedule`` (cron, UTC) becomes a
``maintain_<flow>_schedule``; without one, the job runs when launched.
"""

from typing import Any

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from assets.keys import flow_table_keys
from pipelines.catalog.roles import TableRole, parse_role_id, role_id
from pipelines.catalog.tables import check_locations
from pipelines.maintenance import TableReport, maintain_flow
from pipelines.settings import Settings
from pipelines.spark import prepare_session
from pipelines.spec import FlowSpec


class MaintainConfig(Config):
    optimize: bool | None = Field(
        default=None, description="Run OPTIMIZE (default: the spec's maintenance.optimize)."
    )
    vacuum: bool | None = Field(
        default=None, description="Run VACUUM (default: the spec's maintenance.vacuum)."
    )


def maintenance_pool(spec: FlowSpec) -> str:
    """The pool of a flow's maintenance runs: one at a time, beside (not instead of) the flow."""
    return f"conflux/maintain/{spec.name}"


def observed_key(spec: FlowSpec, table_id: str) -> AssetKey | None:
    """The asset a table's maintenance is reported on: its own, or for the current table's
    ``__deleted_keys`` side table, the current table's (a gold table's side tables: none)."""
    role, gold = parse_role_id(table_id)
    if role is TableRole.DELETED_KEYS:
        role = TableRole.CURRENT
    return flow_table_keys(spec).get(role_id(role, gold))


def observation_metadata(report: TableReport) -> dict[str, Any]:
    """What the UI shows for one table's maintenance (unknown values left out)."""
    metadata: dict[str, Any] = {
        "table": report.table,
        "table_path": MetadataValue.path(report.path),
        "status": report.status,
        "files_before": report.files_before,
        "files_after": report.files_after,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "optimized": report.optimized,
        "files_compacted": report.files_removed,
        "files_written": report.files_added,
        "vacuumed": report.vacuumed,
        "files_vacuumed": report.files_vacuumed,
        "vacuum_retention_hours": report.retention_hours,
        "vacuum_retention_reason": report.retention_reason,
        "attempts": report.attempts,
        "seconds": report.seconds,
    }
    if report.notes:
        metadata["notes"] = MetadataValue.text("\n".join(report.notes))
    if report.errors:
        metadata["errors"] = MetadataValue.text("\n".join(report.errors))
    return {k: v for k, v in metadata.items() if v is not None}


def maintenance_job(spec: FlowSpec, settings: Settings) -> JobDefinition:
    """``maintain_<flow>``: OPTIMIZE and VACUUM every table of the flow, observed on its assets."""

    @op(
        name=f"maintain_{spec.name}_tables",
        pool=maintenance_pool(spec),
        description=f"OPTIMIZE and VACUUM the tables of flow {spec.name} ({spec.spec_file}).",
    )
    def _maintain(
        context: OpExecutionContext, config: MaintainConfig, pyspark: LazyPySparkResource
    ) -> None:
        check_locations([spec], settings)  # before Spark starts: on a cluster, no local path
        reports = maintain_flow(
            prepare_session(pyspark.spark_session, settings),
            spec,
            settings,
            optimize=config.optimize,
            vacuum=config.vacuum,
        )
        if not reports:
            context.log.info(f"flow {spec.name} has no table yet: nothing to maintain")
        for report in reports:
            log = context.log.info if report.ok else context.log.error
            log(report.summary())
            key = observed_key(spec, report.role)
            if key is not None:
                context.log_event(
                    AssetObservation(
                        asset_key=key,
                        description=f"Table maintenance of {report.table}: {report.status}",
                        metadata=observation_metadata(report),
                    )
                )
        failed = [r for r in reports if not r.ok]
        if failed:
            raise Failure(
                description=(
                    f"maintenance of flow {spec.name}: {len(failed)} of {len(reports)} table(s) "
                    f"failed: {', '.join(r.table for r in failed)}"
                ),
                metadata={
                    "errors": MetadataValue.text("\n".join(e for r in failed for e in r.errors))
                },
            )

    @job(
        name=f"maintain_{spec.name}",
        description=(
            f"Table maintenance of flow {spec.name}: OPTIMIZE, then VACUUM with the slowest "
            "reader's retention (maintenance: in its spec)."
        ),
        tags={"conflux/flow": spec.name, "conflux/kind": "maintenance"},
    )
    def _job() -> None:
        _maintain()

    return _job


def maintenance_schedule(spec: FlowSpec, maintain: JobDefinition) -> ScheduleDefinition | None:
    """The spec's ``maintenance.schedule`` (cron, UTC) of the flow's maintenance job, if any."""
    cron = spec.maintenance.schedule
    if cron is None:
        return None
    return ScheduleDefinition(
        name=f"maintain_{spec.name}_schedule",
        job=maintain,
        cron_schedule=cron.strip(),
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,  # declared in the spec: wanted
        description=f"maintenance.schedule of {spec.spec_file}: {cron.strip()} (UTC)",
    )

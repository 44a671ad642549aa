"""Sensors of the control plane.

``conflux_dead_run_workers``: the default run launcher cannot tell that a run worker died, so a
run whose worker was killed would stay STARTED forever, holding its flow's concurrency pool. The
worker renews its flows' leases (:mod:`pipelines.lease`) and records its run id and pid in them;
this sensor marks a STARTED run failed once the lease it holds has expired without renewal, or
its worker process is gone from this host. Failing the run frees the pool; the orphaned Spark
application stops by itself when the lease lapses, and the next launch takes the lease over.
"""

from __future__ import annotations

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from pipelines.launcher import owner_process_gone
from pipelines.lease import FileLeaseStore
from pipelines.locations import FlowLocations
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

ACTIVE = (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)


def dead_run_worker_sensor(specs: list[FlowSpec], settings: Settings) -> SensorDefinition:
    lease_dirs = {spec.name: FlowLocations.of(spec, settings).lease_dir for spec in specs}

    @sensor(
        name="conflux_dead_run_workers",
        minimum_interval_seconds=10,
        default_status=DefaultSensorStatus.RUNNING,
        description="Fails runs whose worker died (their flow lease lapsed), freeing the flow.",
    )
    def _dead_run_workers(context: SensorEvaluationContext) -> SkipReason:
        failed = []
        for flow, lease_dir in lease_dirs.items():
            term = FileLeaseStore(lease_dir).latest()
            run_id = term.details.get("dagster_run_id") if term else None
            if term is None or term.released or not run_id:
                continue
            if term.live() and not owner_process_gone(term):
                continue
            run = context.instance.get_run_by_id(run_id)
            if run is None or run.status not in ACTIVE:
                continue
            context.instance.report_run_failed(
                run,
                f"the run worker of flow {flow} is gone: its lease ({term.describe()}) was not "
                "renewed. The Spark application stops by itself when the lease lapses; the next "
                "launch takes the flow over.",
            )
            failed.append(run_id)
        return SkipReason(f"marked failed: {failed}" if failed else "every run worker is alive")

    return _dead_run_workers

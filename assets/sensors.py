"""Sensors of the control plane.

``conflux_dead_run_workers``: the default run launcher cannot tell that a run worker died, so a
run whose worker was killed would stay STARTED forever, holding its flow's concurrency pool. The
step that launches a flow records its run id and the run worker's pid in the flow's lease
(:mod:`pipelines.lease`) and renews it. This sensor marks a STARTED run failed when that run
worker's process is gone from this host, or (for a worker on another host) when the lease has
been expired, unreleased, for a whole lease period. Failing the run frees the pool. The Spark
application does not outlive its launcher: a step whose run worker died stops it at once; a
launcher killed outright stops renewing, and the application stops within one lease period.
"""

from __future__ import annotations

import time

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from pipelines.lease import FileLeaseStore, process_gone
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
            if term is None or not run_id:
                continue
            worker_gone = process_gone(term.details.get("host"), term.details.get("run_worker_pid"))
            lapsed = not term.released and term.expires_at + term.duration < time.time()
            if not (worker_gone or lapsed):
                continue
            run = context.instance.get_run_by_id(run_id)
            if run is None or run.status not in ACTIVE:
                continue
            context.instance.report_run_failed(
                run,
                f"the run worker of flow {flow} is gone (lease {term.describe()}"
                f"{', released' if term.released else ', not renewed'}). Its Spark application "
                "stops by itself within one lease period; the next launch takes the flow over.",
            )
            failed.append(run_id)
        return SkipReason(f"marked failed: {failed}" if failed else "every run worker is alive")

    return _dead_run_workers

"""Sensors of the control plane.

``conflux_dead_run_workers``: a run whose worker died must not stay STARTED and hold its flow's
concurrency pool. Under ``dagster dev`` the code server that spawned a run worker notices a
SIGKILL itself and fails the run within a second (tested in ``tests/e2e/test_continuous_run.py``);
nothing does when that code server is gone too (restarted, or the worker's host lost), and the
default run launcher cannot check run-worker health. The step that launches a flow tags the run
with its run worker's host and pid (:data:`RUN_WORKER_TAG`) and records the run in the flow's
lease (:mod:`pipelines.lease`), which it renews. This sensor marks an active run failed when that
run worker's process is gone from this host, or (for a worker on another host) when the run's
lease has been expired, unreleased, for a whole lease period; failing the run frees the pool. The
Spark application does not outlive its launcher: a step whose run worker died stops it at once,
and a launcher killed outright stops renewing, so the application stops within one lease period.
"""

from __future__ import annotations

import time

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from pipelines.catalog.state import FlowState
from pipelines.lease import process_gone
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

ACTIVE = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
#: Run tag set by the launching step: ``<host>:<pid>`` of the run's worker process.
RUN_WORKER_TAG = "conflux/run_worker"


def dead_run_worker_sensor(specs: list[FlowSpec], settings: Settings) -> SensorDefinition:
    lease_stores = {spec.name: FlowState.of(spec, settings).lease_store() for spec in specs}

    @sensor(
        name="conflux_dead_run_workers",
        minimum_interval_seconds=10,
        default_status=DefaultSensorStatus.RUNNING,
        description="Fails runs whose worker died (their flow lease lapsed), freeing the flow.",
    )
    def _dead_run_workers(context: SensorEvaluationContext) -> SkipReason:
        dead: dict[str, str] = {}
        for active in context.instance.get_runs(RunsFilter(statuses=ACTIVE), limit=500):
            host, _, pid = active.tags.get(RUN_WORKER_TAG, "").rpartition(":")
            if host and process_gone(host, pid):
                dead[active.run_id] = f"its run worker (pid {pid} on {host}) is gone"
        for flow, store in lease_stores.items():
            term = store.latest()
            run_id = term.details.get("dagster_run_id") if term else None
            if term is None or not run_id or term.released or run_id in dead:
                continue
            if term.expires_at + term.duration < time.time():  # a worker on another host
                dead[run_id] = f"the lease of flow {flow} lapsed: {term.describe()}"
        failed = []
        for run_id, why in dead.items():
            run = context.instance.get_run_by_id(run_id)
            if run is None or run.status not in ACTIVE:
                continue
            context.instance.report_run_failed(
                run,
                f"the run worker died: {why}. Its Spark application stops by itself within one "
                "lease period (CONFLUX_LEASE_SECONDS); the next launch takes the flow over.",
            )
            failed.append(run_id)
        return SkipReason(f"marked failed: {failed}" if failed else "every run worker is alive")

    return _dead_run_workers

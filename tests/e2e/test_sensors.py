"""The dead-run-worker sensor against a real Dagster instance: a STARTED run whose worker process is
gone is failed (which frees its flow's pool); a run whose worker lives is left alone."""

import os
import socket
from pathlib import Path

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SkipReason, build_sensor_context

from assets.sensors import RUN_WORKER_TAG, dead_run_worker_sensor
from pipelines.settings import Settings
from pipelines.spec import parse_spec

NO_SUCH_PID = 999_999_999  # above the kernel's pid_max: never a live process


def started_run(instance: DagsterInstance, worker_pid: int) -> DagsterRun:
    run = DagsterRun(
        job_name="run_orders_live",
        status=DagsterRunStatus.STARTED,
        tags={RUN_WORKER_TAG: f"{socket.gethostname()}:{worker_pid}"},
    )
    return instance.add_run(run)


def test_a_run_whose_worker_is_gone_is_failed_and_a_live_one_is_not(tmp_path: Path) -> None:
    spec = parse_spec(
        {"name": "orders", "source": {"kind": "kafka", "topics": ["o"]}, "target": {"table": "t"}}
    )
    sensor = dead_run_worker_sensor([spec], Settings(runtime_dir=tmp_path, jars_dir=tmp_path))
    with DagsterInstance.ephemeral() as instance:
        dead = started_run(instance, NO_SUCH_PID)
        alive = started_run(instance, os.getpid())
        result = sensor(build_sensor_context(instance=instance))
        assert isinstance(result, SkipReason) and dead.run_id in str(result.skip_message)
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(alive.run_id).status == DagsterRunStatus.STARTED
        messages = [
            (r.dagster_event.message or "") if r.dagster_event else (r.user_message or "")
            for r in instance.all_logs(dead.run_id)
        ]
        assert any("the run worker died" in m for m in messages), messages

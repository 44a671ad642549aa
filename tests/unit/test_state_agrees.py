"""``conflux status``, the Dagster ``stream_health`` check and the ``conflux_stream_health``
sensor say the same state, in each state a flow can be in (waiting for source: the application down, or one query
waiting inside it): each state is set up in the flow's
real files (lease, heartbeat, status file) by the classes that write them in a run, then read by
the three (the check and the sensor invoked as Dagster would, on an ephemeral instance)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, build_sensor_context

from assets.health import health_check, stream_health_sensor
from pipelines.catalog.state import FlowState
from pipelines.cli import main
from pipelines.health import HeartbeatWriter
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.messages import FlowStopped, StopReason
from pipelines.reporting import Reporter
from pipelines.run_state import Phase, RunState, flow_run_state
from pipelines.settings import Settings, load_settings
from pipelines.spec import FlowSpec, load_spec
from pipelines.status import Supervision, write_status
from pipelines.supervisor import RestartPolicy, note_pending_restart, supervisor_note

OWNER = "cli-1"


def lease(spec: FlowSpec, settings: Settings) -> FlowLease:
    here = {"host": socket.gethostname(), "pid": str(os.getpid())}
    store = FileLeaseStore(FlowState.of(spec, settings).lease_dir.path)
    held = FlowLease(spec.name, store, OWNER, here, 60.0)
    held.acquire()
    return held


def beat(spec: FlowSpec, settings: Settings) -> HeartbeatWriter:
    writer = HeartbeatWriter({spec.name: FlowState.of(spec, settings).health_file}, OWNER)
    writer.beat(spec.name, f"{spec.name}.bronze", committed_batch=1, lag=0)
    return writer


def record(spec: FlowSpec, settings: Settings, stopped: FlowStopped) -> None:
    reporter = Reporter()
    reporter.track_status({spec.name: FlowState.of(spec, settings).status_file}, OWNER)
    reporter.stopped(stopped)


def running(spec: FlowSpec, settings: Settings) -> None:
    lease(spec, settings)
    beat(spec, settings)


def stopping(spec: FlowSpec, settings: Settings) -> None:
    lease(spec, settings)
    beat(spec, settings).stopped()


def failed_disk_full(spec: FlowSpec, settings: Settings) -> None:
    held = lease(spec, settings)
    message = "flow orders failed: disk full on /lake: writing /lake/t failed"
    record(spec, settings, FlowStopped(spec.name, StopReason.DISK_FULL, message, exit_code=1))
    held.release()


def stopped_on_request(spec: FlowSpec, settings: Settings) -> None:
    held = lease(spec, settings)
    by = "conflux stop (user ann on h1, pid 42)"
    record(spec, settings, FlowStopped(spec.name, StopReason.STOPPED_ON_REQUEST, by, exit_code=0))
    held.release()


def restarting(spec: FlowSpec, settings: Settings) -> None:
    lease(spec, settings).release()
    note_pending_restart([spec], settings, OWNER, 1, "killed by SIGKILL", os.getpid())


def waiting_for_source(spec: FlowSpec, settings: Settings) -> None:
    held = lease(spec, settings)
    record(spec, settings, FlowStopped(spec.name, StopReason.SOURCE_ERROR, "broker gone"))
    held.release()
    now = time.time()
    note = supervisor_note(
        Supervision.WAITING_FOR_SOURCE, 0, RestartPolicy.of([spec]), now, now + 5, "down",
        os.getpid(),
    )  # fmt: skip
    write_status(spec, settings, OWNER, lambda status: replace(status, supervision=note))


def query_waiting_for_source(spec: FlowSpec, settings: Settings) -> None:
    """A query waits for its broker inside its running application (``pipelines/outages.py``):
    the lease is live, the heartbeat beats for the run's other queries."""
    running(spec, settings)
    now = time.time()
    note = supervisor_note(
        Supervision.WAITING_FOR_SOURCE, 0, RestartPolicy.of([spec]), now, now + 5, "down",
        os.getpid(),
    )  # fmt: skip
    note = replace(note, query=f"{spec.name}.bronze")
    write_status(spec, settings, OWNER, lambda status: replace(status, supervision=note))


STATES: list[tuple[Phase, Callable[[FlowSpec, Settings], None] | None]] = [
    (Phase.NEVER_RUN, None),
    (Phase.RUNNING, running),
    (Phase.STOPPING, stopping),
    (Phase.FAILED, failed_disk_full),
    (Phase.STOPPED, stopped_on_request),
    (Phase.RESTARTING, restarting),
    (Phase.WAITING_FOR_SOURCE, waiting_for_source),
    (Phase.WAITING_FOR_SOURCE, query_waiting_for_source),
]


@pytest.mark.parametrize(
    ("phase", "setup"),
    STATES,
    ids=[setup.__name__ if setup else "never_run" for _, setup in STATES],
)
def test_status_the_check_and_the_sensor_say_the_same_state(
    phase: Phase,
    setup: Callable[[FlowSpec, Settings], None] | None,
    flows: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = flows / "orders.yaml"
    spec_data = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "trigger": {"mode": "continuous"},
    }
    path.write_text(yaml.safe_dump(spec_data))
    spec, settings = load_spec(path), load_settings()
    if setup is not None:
        setup(spec, settings)
    state: RunState = flow_run_state(spec, settings)
    assert state.phase is phase, state

    assert main(["status", "orders", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["run"]["phase"], report["run"]["state"]) == (phase.value, state.token)

    result = health_check(spec, settings)()
    assert result.passed == state.ok and result.metadata["phase"].value == phase.value
    assert result.metadata["state"].value == state.token

    with DagsterInstance.ephemeral() as instance:
        told = stream_health_sensor([spec], settings)(build_sensor_context(instance=instance))
    expected = (
        "no continuous flow is running" if phase is Phase.NEVER_RUN else f"orders: {state.token}"
    )
    assert told.skip_message == expected

"""A flow's state as an operator reads it (:mod:`pipelines.run_state`), from real lease, status
and heartbeat files: each phase, and what each says. No Spark: the files are written by the
same classes a running flow writes them with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.health import HeartbeatWriter
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.messages import FlowStopped, StopReason
from pipelines.reporting import Reporter
from pipelines.run_state import NOTE_GRACE_SECONDS, Phase, flow_run_state
from pipelines.settings import load_settings
from pipelines.spec import FlowSpec, load_spec
from pipelines.supervisor import note_pending_restart


@pytest.fixture
def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FlowSpec:
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    path = tmp_path / "orders.yaml"
    spec = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "trigger": {"mode": "continuous", "interval": "1 second", "stale_after": "60 seconds"},
    }
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)


def lease(spec: FlowSpec, owner: str, pid: int, seconds: float = 60.0) -> FlowLease:
    folder = FlowState.of(spec, load_settings()).lease_dir.path
    details = {"host": socket.gethostname(), "pid": str(pid)}
    held = FlowLease(spec.name, FileLeaseStore(folder), owner, details, seconds)
    held.acquire()
    return held


def heartbeat(spec: FlowSpec, owner: str) -> HeartbeatWriter:
    return HeartbeatWriter({spec.name: FlowState.of(spec, load_settings()).health_file}, owner)


def record(spec: FlowSpec, owner: str, stopped: FlowStopped) -> None:
    reporter = Reporter()
    reporter.track_status({spec.name: FlowState.of(spec, load_settings()).status_file}, owner)
    reporter.stopped(stopped)


def test_never_run_then_running_with_its_heartbeats_lag(flow: FlowSpec) -> None:
    settings = load_settings()
    assert flow_run_state(flow, settings).phase is Phase.NEVER_RUN
    lease(flow, "cli-1", os.getpid())  # the launcher lives
    starting = flow_run_state(flow, settings)
    assert (starting.phase, starting.token, starting.lag_text()) == (
        Phase.RUNNING,
        "starting",
        "unknown",
    )
    heartbeat(flow, "cli-1").beat("orders", "orders.bronze", committed_batch=3, lag=120)
    running = flow_run_state(flow, settings)
    assert running.phase is Phase.RUNNING and running.ok and running.token == "healthy"
    assert running.lag == {"orders.bronze": 120} and running.lag_text() == "120"
    assert running.summary.startswith("running (cli-1): healthy: every query heard")


def test_a_failure_is_recorded_with_its_reason_time_exit_code_and_first_line(
    flow: FlowSpec,
) -> None:
    held = lease(flow, "cli-2", os.getpid())
    heartbeat(flow, "cli-2").beat("orders", "orders.bronze", committed_batch=1, lag=0)
    cause = "disk full on /lake: java.io.IOException: No space left on device\n\tat ..."
    record(flow, "cli-2", FlowStopped("orders", StopReason.DISK_FULL, cause, exit_code=1))
    held.release()
    state = flow_run_state(flow, load_settings())
    assert state.phase is Phase.FAILED and not state.ok and state.reason is StopReason.DISK_FULL
    assert state.short == "failed: disk full"
    assert " exit code 1: disk full: disk full on /lake: java.io.IOException" in state.summary
    assert "\tat" not in state.summary and state.cause == cause.splitlines()[0]
    assert state.lag is None and state.lag_text() == "unknown"  # not the last heartbeat's 0
    assert state.to_json()["at"] and state.to_json()["exit_code"] == 1


def test_a_clean_stop_says_who_asked(flow: FlowSpec) -> None:
    held = lease(flow, "cli-3", os.getpid())
    by = "conflux stop (user ann on h1, pid 42)"
    record(flow, "cli-3", FlowStopped("orders", StopReason.STOPPED_ON_REQUEST, by, exit_code=0))
    held.release()
    state = flow_run_state(flow, load_settings())
    assert state.phase is Phase.STOPPED and state.ok
    assert state.summary.endswith(f": stopped on request by {by}")


def test_a_killed_application_is_a_crash_or_restarting_under_a_supervisor(
    flow: FlowSpec,
) -> None:
    """The application beats once, then is gone: a process of its own that exits, as a killed
    driver's would."""
    settings = load_settings()
    held = lease(flow, "cli-4", os.getpid())  # the launcher lives on (a Dagster step, a terminal)
    health_file = FlowState.of(flow, settings).health_file.path
    beat_once = (
        "import sys; from pipelines.health import HeartbeatWriter; from pipelines.location "
        "import Location; HeartbeatWriter({'orders': Location.local(sys.argv[1])}, 'cli-4')"
        ".beat('orders', 'orders.bronze', committed_batch=1, lag=0)"
    )
    subprocess.run([sys.executable, "-c", beat_once, str(health_file)], check=True)
    crashed = flow_run_state(flow, settings)
    assert crashed.phase is Phase.FAILED and crashed.reason is StopReason.CRASH
    assert "its application is not running" in crashed.summary and "expires" in crashed.summary
    # Its supervisor (here: this process, as Dagster's run worker would be) will restart it.
    note_pending_restart([flow], settings, "cli-4", 1, "killed", os.getpid())
    held.release()
    restarting = flow_run_state(flow, settings)
    assert restarting.phase is Phase.RESTARTING and not restarting.ok
    assert "attempt 1 of 5 at " in restarting.summary and "after killed" in restarting.summary
    later = flow_run_state(flow, settings, now=time.time() + 10 + NOTE_GRACE_SECONDS + 1)
    assert later.phase is Phase.FAILED  # long overdue: its supervisor is gone or stuck


def test_an_expired_lease_shows_as_expired(flow: FlowSpec) -> None:
    lease(flow, "cli-5", os.getpid(), seconds=0.5)
    time.sleep(1.0)
    state = flow_run_state(flow, load_settings())
    assert state.phase is Phase.FAILED and state.reason is StopReason.CRASH
    assert "ended without recording why" in state.summary and "expired at" in state.summary
    assert "s ago)" in state.summary

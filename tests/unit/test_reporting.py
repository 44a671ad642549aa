"""What the runner reports where (no Spark): the typed messages as Pipes custom messages, the
last batch in the flow's ``_status.json`` in the shape the previous version wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.lease import LeaseHeldError
from pipelines.location import Location
from pipelines.messages import (
    BatchCommitted,
    FlowStopped,
    StageStarted,
    StopReason,
    TableWrite,
    parse_message,
)
from pipelines.reporting import PROGRESS_PREFIX, Reporter
from pipelines.runner import EXIT_LEASE, not_started
from pipelines.status import FlowStatus


class FakeLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def error(self, message: str) -> None:
        self.lines.append(message)


class FakePipes:
    """The parts of dagster_pipes' context the reporter uses."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.log = FakeLog()
        self.extras: dict[str, Any] = {}

    def report_custom_message(self, payload: Any) -> None:
        self.messages.append(json.loads(json.dumps(payload)))  # what crosses the wire


BATCH = BatchCommitted(
    flow="orders", stage="bronze", batch_id=3, input_rows=5, rows_added=5, replayed=False,
    input_rows_per_second=1.0, processed_rows_per_second=2.0, batch_duration_ms=900,
    end_offsets={"orders": {"0": 5}}, latest_offsets={"orders": {"0": 5}}, lag=0,
    partition_lag={"orders-0": 0}, delta_version=4, timestamp="2025-06-02T09:14:03.512Z",
    writes=(TableWrite("bronze_orders", "bronze", 4, 5, False),),
)  # fmt: skip


def test_every_message_reaches_pipes_and_parses_back(tmp_path: Path, capsys: Any) -> None:
    pipes = FakePipes()
    reporter = Reporter(pipes)
    status_file = Location.local(tmp_path / "orders" / "_status.json")
    reporter.track_status({"orders": status_file}, owner="runner-0a1b2c3d4e5f")
    started = StageStarted("orders", "bronze", "orders")
    stopped = FlowStopped("orders", StopReason.FINISHED)
    reporter.started(started)
    reporter.batch(BATCH)
    reporter.error("flow orders failed: boom")
    reporter.stopped(stopped)
    assert [parse_message(m) for m in pipes.messages] == [
        started,
        BATCH,
        parse_message({"type": "error", "message": "flow orders failed: boom"}),
        stopped,
    ]
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith(PROGRESS_PREFIX)]
    assert json.loads(line.removeprefix(PROGRESS_PREFIX)) == BATCH.to_json()  # only batches
    written = json.loads(status_file.read_text())
    assert written == {
        "owner": "runner-0a1b2c3d4e5f",
        "last_batch": BATCH.to_json(),
        "stopped": stopped.to_json(),
    }
    assert FlowStatus.parse(written) == FlowStatus("runner-0a1b2c3d4e5f", BATCH, stopped)


def test_the_status_file_keeps_the_last_batch_of_an_earlier_run_beside_this_runs_stop(
    tmp_path: Path,
) -> None:
    """A run that failed before its first batch records why, and the last batch stays the one
    the run before it committed; the next batch clears the stop (the flow runs again)."""
    status_file = Location.local(tmp_path / "orders" / "_status.json")
    earlier = Reporter()
    earlier.track_status({"orders": status_file}, owner="runner-1")
    earlier.batch(BATCH)
    failing = Reporter()
    failing.track_status({"orders": status_file}, owner="runner-2")
    crash = FlowStopped("orders", StopReason.SOURCE_ERROR, "flow orders failed: broker gone")
    failing.stopped(crash)
    assert FlowStatus.parse(json.loads(status_file.read_text())) == FlowStatus(
        "runner-2", BATCH, crash
    )
    failing.batch(BATCH)
    assert FlowStatus.parse(json.loads(status_file.read_text())) == FlowStatus("runner-2", BATCH)
    untracked = FlowStopped("payments", StopReason.LEASE_HELD, "held by runner-9")
    failing.stopped(untracked)  # not a flow this run holds: nothing written for it
    assert not (tmp_path / "payments").exists()


def test_flows_that_never_ran_are_reported_stopped_with_the_reason() -> None:
    pipes = FakePipes()
    error = LeaseHeldError("flow orders: held by dagster-1 since 09:00")
    assert not_started(Reporter(pipes), ["orders"], error, str(error), EXIT_LEASE) == EXIT_LEASE
    assert parse_message(pipes.messages[-1]) == FlowStopped(
        "orders", StopReason.LEASE_HELD, str(error), exit_code=EXIT_LEASE
    )

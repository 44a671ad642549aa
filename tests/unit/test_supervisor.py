"""``conflux run``'s supervision (:mod:`pipelines.supervisor`) decides from what each ended run
left in the flow's files, as a real one leaves them (the lease and status file written by the
classes the launcher and runner use). Here a run is one such ending, the clock a counter, the
broker probe a script of answers: the real application and broker are in
``tests/integration/test_source_faults.py``."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.messages import FlowStopped, StopReason
from pipelines.reporting import Reporter
from pipelines.run_state import Phase, RunState, flow_run_state
from pipelines.runner import EXIT_FAILED, EXIT_LEASE, EXIT_OK
from pipelines.settings import Settings, load_settings
from pipelines.spec import FlowSpec, KafkaSource, load_spec
from pipelines.status import read_status
from pipelines.supervisor import Attempt, Supervisor


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FlowSpec:
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    path = tmp_path / "orders.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "orders",
                "source": {"kind": "kafka", "topics": ["orders"], "unavailable_for": "60 seconds"},
                "target": {"table": "bronze_orders"},
                "trigger": {"mode": "continuous", "max_restarts": 2, "restart_delay": "2 seconds"},
            }
        )
    )
    return load_spec(path)


class Runs:
    """Each call is one application of the run: it takes the lease, records ``ending`` (None:
    killed, nothing recorded) as the runner does, releases the lease and exits with ``code``."""

    def __init__(self, spec: FlowSpec, endings: list[tuple[int, StopReason | None]]) -> None:
        self.spec, self.endings, self.owners = spec, iter(endings), itertools.count(1)

    def __call__(self) -> Attempt:
        code, reason = next(self.endings)
        owner = f"cli-{next(self.owners)}"
        state = FlowState.of(self.spec, load_settings())
        here = {"host": socket.gethostname(), "pid": str(os.getpid())}  # the launcher lives
        lease = FlowLease("orders", FileLeaseStore(state.lease_dir.path), owner, here)
        lease.acquire()
        if reason is not None:
            reporter = Reporter()
            reporter.track_status({"orders": state.status_file}, owner)
            reporter.stopped(FlowStopped("orders", reason, f"flow orders failed: {reason}"))
        lease.release()
        return Attempt(code, owner)


class Clock:
    """The supervisor's clock and sleep: a wait advances the clock; each wait records the flow's
    state as an operator would read it then."""

    def __init__(self, spec: FlowSpec, settings: Settings, interrupt_at: int | None = None):
        self.now, self.waits, self.states = 1_000_000.0, list[float](), list[RunState]()
        self.spec, self.settings, self.interrupt_at = spec, settings, interrupt_at

    def time(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (0: only ask whether a stop was requested)."""
        if seconds > 0:
            self.states.append(flow_run_state(self.spec, self.settings, now=self.now))
            self.waits.append(seconds)
            self.now += seconds
        return len(self.waits) == self.interrupt_at


def answers(*replies: str | None) -> Iterator[str | None]:
    return iter(replies)


def supervise(
    spec: FlowSpec,
    endings: list[tuple[int, StopReason | None]],
    probes: Iterator[str | None] | None = None,
    interrupt_at: int | None = None,
) -> tuple[int, Clock, list[str]]:
    settings, said = load_settings(), list[str]()
    clock = Clock(spec, settings, interrupt_at)

    def probe(_source: KafkaSource, _settings: Settings) -> str | None:
        assert probes is not None, "no probe expected"
        return next(probes)

    supervisor = Supervisor([spec], settings, wait=clock.wait, probe=probe, clock=clock.time)
    return supervisor.run(Runs(spec, endings), say=said.append), clock, said


def test_a_killed_application_restarts_with_dagsters_backoff_then_gives_up(
    spec: FlowSpec,
) -> None:
    code, clock, said = supervise(spec, [(137, None), (EXIT_FAILED, StopReason.CRASH), (137, None)])
    assert code == 137 and clock.waits == [2.0, 6.0]  # 1 then 3 times restart_delay
    first, second = clock.states
    assert first.phase is Phase.RESTARTING and "attempt 1 of 2" in first.summary
    assert "killed by SIGKILL (exit code 137) without recording why" in first.summary
    assert second.phase is Phase.RESTARTING and "attempt 2 of 2" in second.summary
    assert "flow orders failed: crash" in second.summary
    assert said[-1].startswith("gave up after 2 restart(s)")
    final = flow_run_state(spec, load_settings(), now=clock.now)
    assert final.phase is Phase.FAILED and "gave up after 2 restart(s)" in final.summary


def test_an_unreachable_source_is_waited_for_without_counting_restarts(spec: FlowSpec) -> None:
    endings = [(EXIT_FAILED, StopReason.SOURCE_ERROR)] * 3 + [(EXIT_OK, StopReason.FINISHED)]
    probes = answers("down", None, "down", "down", None, None)
    code, clock, _said = supervise(spec, endings, probes)
    # The third failure is answered by the first probe: a failure the probe does not see, so a
    # counted restart (2 s) follows its 5 s.
    assert code == EXIT_OK and clock.waits == [5.0, 10.0, 5.0, 10.0, 20.0, 5.0, 2.0]
    assert {s.phase for s in clock.states[:-1]} == {Phase.WAITING_FOR_SOURCE}
    assert "flow orders failed: source_error" in clock.states[0].summary
    assert (
        "waiting for source since" in clock.states[1].summary
        and ": down" in clock.states[1].summary
    )
    final = flow_run_state(spec, load_settings(), now=clock.now)
    assert final.phase is Phase.STOPPED


def test_a_source_unreachable_past_unavailable_for_fails_the_flow_with_that_reason(
    spec: FlowSpec,
) -> None:
    probes = answers(*["refused"] * 10)
    code, clock, _said = supervise(spec, [(EXIT_FAILED, StopReason.SOURCE_ERROR)], probes)
    assert code == EXIT_FAILED and sum(clock.waits) == 60.0  # 5 + 10 + 20 + 25: capped
    state = flow_run_state(spec, load_settings(), now=clock.now)
    assert state.phase is Phase.FAILED and state.reason is StopReason.SOURCE_UNAVAILABLE
    assert "the source stayed unreachable for 1 min (source.unavailable_for): refused" in (
        state.summary
    )


def test_a_flow_whose_application_waited_for_the_source_in_vain_is_not_restarted(
    spec: FlowSpec,
) -> None:
    """``source_unavailable``: the application already waited ``source.unavailable_for``
    (``pipelines/outages.py``); another wait, or a restart, would double it."""
    code, clock, _said = supervise(spec, [(EXIT_FAILED, StopReason.SOURCE_UNAVAILABLE)])
    assert code == EXIT_FAILED and clock.waits == []
    assert flow_run_state(spec, load_settings()).reason is StopReason.SOURCE_UNAVAILABLE


def test_a_refusal_the_spec_asked_for_is_not_restarted(spec: FlowSpec) -> None:
    code, clock, _said = supervise(spec, [(EXIT_FAILED, StopReason.EXPECTATION_FAILED)])
    assert code == EXIT_FAILED and clock.waits == []
    assert flow_run_state(spec, load_settings()).reason is StopReason.EXPECTATION_FAILED


def test_ctrl_c_while_waiting_stops_the_flow_on_request(spec: FlowSpec) -> None:
    code, clock, _said = supervise(spec, [(137, None)], interrupt_at=1)
    assert code == EXIT_OK and clock.waits == [2.0]
    state = flow_run_state(spec, load_settings(), now=clock.now)
    assert state.phase is Phase.STOPPED and "a stop of conflux run (Ctrl-C" in state.summary


def test_ctrl_c_while_waiting_for_the_source_stops_the_flow_and_exits_0(spec: FlowSpec) -> None:
    probes = answers("down", "down")
    code, clock, _said = supervise(
        spec, [(EXIT_FAILED, StopReason.SOURCE_ERROR)], probes, interrupt_at=2
    )
    assert code == EXIT_OK and clock.waits == [5.0, 10.0]
    state = flow_run_state(spec, load_settings(), now=clock.now)
    assert state.phase is Phase.STOPPED and state.stopped is not None
    assert state.stopped.exit_code == EXIT_OK


def test_a_source_failure_the_probe_does_not_see_is_restarted_and_ends(spec: FlowSpec) -> None:
    """A deleted topic fails the flow with source_error while the broker answers: restarted like
    a crash (counted), not waited for forever."""
    endings = [(EXIT_FAILED, StopReason.SOURCE_ERROR)] * 3
    code, clock, said = supervise(spec, endings, answers(None, None, None))
    assert code == EXIT_FAILED and clock.waits == [5.0, 2.0, 5.0, 6.0, 5.0]
    assert said[-1].startswith("gave up after 2 restart(s): flow orders failed: source_error")


def test_a_flow_taken_over_meanwhile_is_left_to_its_new_owner(spec: FlowSpec) -> None:
    """While the supervisor waits, another run (Dagster, another terminal) takes the flow: the
    supervisor stops supervising and leaves the new owner's status file alone."""
    settings = load_settings()
    state = FlowState.of(spec, settings)
    probes = iter(["down"])

    def probe(_source: KafkaSource, _settings: Settings) -> str | None:
        other = FlowLease("orders", FileLeaseStore(state.lease_dir.path), "dagster-9", {})
        other.acquire()
        reporter = Reporter()
        reporter.track_status({"orders": state.status_file}, "dagster-9")
        reporter.stopped(FlowStopped("orders", StopReason.FINISHED))
        return next(probes)

    clock = Clock(spec, settings)
    supervisor = Supervisor([spec], settings, wait=clock.wait, probe=probe, clock=clock.time)
    said: list[str] = []
    code = supervisor.run(Runs(spec, [(EXIT_FAILED, StopReason.SOURCE_ERROR)]), said.append)
    assert code == EXIT_LEASE and said[-1].startswith("flow orders was taken over by dagster-9")
    assert read_status(spec, settings).owner == "dagster-9"
    assert read_status(spec, settings).supervision is None

"""A query whose Kafka brokers stop answering waits for them inside its running application and
starts again from its checkpoint (``pipelines/outages.py``), under the runner's own supervision
loop: no JVM (queries are stand-ins with Spark's observable contract; the failure is a Kafka
client exception as Py4J hands it over), a scripted probe and clock. The real outage, through a
broker stopped and started again, is ``tests/integration/test_source_faults.py::TestBrokerRestart``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.health import HeartbeatWriter
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.messages import BatchCommitted, FlowStopped, StopReason
from pipelines.outages import SourceOutages
from pipelines.reporting import Reporter
from pipelines.run_state import Phase, flow_run_state
from pipelines.runner import EXIT_FAILED, EXIT_OK, StopRequest, supervise
from pipelines.settings import Settings, load_settings
from pipelines.spec import FlowSpec, KafkaSource, load_spec
from pipelines.status import read_status
from pipelines.stops import failure_stop, query_exception
from tests.unit.test_stops import KAFKA, STREAMING, JavaThrowable

OWNER = "cli-7"
TIMEOUT = "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment"


@dataclass
class Optional:
    value: Any

    def isDefined(self) -> bool:  # noqa: N802 - Java's name
        return self.value is not None

    def get(self) -> Any:
        return self.value


@dataclass
class Query:
    """A query that is active until ``fail()``, then inactive with Spark's error and its Java
    exception (``_jsq``: what :func:`pipelines.stops.query_exception` reads)."""

    name: str
    error: str | None = None
    throwable: Any = None
    stopped: bool = False
    lastProgress: Any = None  # noqa: N815 - Spark's attribute name
    recentProgress: list[Any] = field(default_factory=list)  # noqa: N815
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def isActive(self) -> bool:  # noqa: N802
        return self.error is None and not self.stopped

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True

    def fail(self) -> None:
        self.throwable = JavaThrowable(STREAMING, "Query failed", JavaThrowable(KAFKA, TIMEOUT))
        self.error = f"[STREAM_FAILED] Query [name = {self.name}] terminated: {TIMEOUT}"

    @property
    def _jsq(self) -> Any:
        query = self

        class Jsq:
            def exception(self) -> Optional:
                return Optional(query.throwable)

        return Jsq()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """The probe: down (a reason) or up (None), as the test sets it; counts the probes."""

    def __init__(self) -> None:
        self.down: str | None = "brokers 127.0.0.1:1 did not answer within 5 s: timed out"
        self.probes = 0

    def __call__(self, source: KafkaSource, settings: Settings) -> str | None:
        self.probes += 1
        return self.down


@pytest.fixture
def spec(flows: Path) -> FlowSpec:
    data = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"], "unavailable_for": "10 minutes"},
        "target": {"table": "bronze_orders"},
        "trigger": {"mode": "continuous"},
    }
    (flows / "orders.yaml").write_text(yaml.safe_dump(data))
    return load_spec(flows / "orders.yaml")


@dataclass
class Run:
    """A running flow's files (a live lease and heartbeat of this process), and its outages."""

    spec: FlowSpec
    settings: Settings
    reporter: Reporter
    outages: SourceOutages
    clock: Clock
    broker: Broker
    restarted: list[Query]


@pytest.fixture
def run(spec: FlowSpec) -> Run:
    settings = load_settings()
    state = FlowState.of(spec, settings)
    here = {"host": socket.gethostname(), "pid": str(os.getpid())}
    FlowLease(spec.name, FileLeaseStore(state.lease_dir.path), OWNER, here, 600.0).acquire()
    HeartbeatWriter({spec.name: state.health_file}, OWNER).beat(
        spec.name, "orders.bronze", committed_batch=1, lag=0
    )
    reporter = Reporter()
    reporter.track_status({spec.name: state.status_file}, OWNER)
    clock, broker, restarted = Clock(), Broker(), []

    def restart(name: str) -> Query:
        restarted.append(Query(name))
        return restarted[-1]

    outages = SourceOutages({spec.name: spec}, settings, reporter, restart, broker, clock)
    return Run(spec, settings, reporter, outages, clock, broker, restarted)


class StopAfter(StopRequest):
    """A stop request that the test's ``script`` may raise at each poll of the loop."""

    def __init__(self, script: Any) -> None:
        super().__init__(None)
        self.script = script

    @property
    def requested(self) -> bool:
        self.script()
        return super().requested


def test_a_query_whose_broker_is_down_waits_in_the_driver_and_starts_again(run: Run) -> None:
    bronze = Query("orders.bronze")
    seen: list[str] = []

    def script() -> None:
        if bronze.error is None and not run.restarted:
            bronze.fail()
            return
        if run.outages.waiting and run.broker.probes < 3:
            state = flow_run_state(run.spec, run.settings)
            seen.append(state.summary)
            run.clock.now += 6  # past the next probe (5 s, then 10: the third answers)
            if run.broker.probes == 2:
                run.broker.down = None
            return
        if run.restarted:
            assert flow_run_state(run.spec, run.settings).phase is Phase.RUNNING
            stop.request("the test")

    stop = StopAfter(script)
    ending = supervise({"orders.bronze": bronze}, stop, run.reporter, outages=run.outages)

    assert ending.code == EXIT_OK, ending
    assert [s.reason for s in ending.stops] == [StopReason.STOPPED_ON_REQUEST]
    assert [q.name for q in run.restarted] == ["orders.bronze"]  # the same driver, no new one
    assert seen and all(s.startswith("waiting for source since ") for s in seen), seen
    assert f"{TIMEOUT} [source_error]" in seen[0], seen[0]
    assert "brokers 127.0.0.1:1 did not answer" in seen[-1], seen[-1]
    assert read_status(run.spec, run.settings).supervision is None  # cleared on the restart


def test_a_broker_that_answers_is_not_waited_for(run: Run) -> None:
    """A deleted topic or a refused login: the brokers answer, so the run fails as any other
    and its supervisor counts a restart."""
    run.broker.down = None
    bronze = Query("orders.bronze")
    bronze.fail()
    ending = supervise(
        {"orders.bronze": bronze}, StopRequest(None), run.reporter, outages=run.outages
    )
    assert ending.code == EXIT_FAILED
    assert [s.reason for s in ending.stops] == [StopReason.SOURCE_ERROR]
    assert not run.restarted and run.broker.probes == 1


def test_past_unavailable_for_the_flow_fails_for_good(run: Run) -> None:
    bronze, other = Query("orders.bronze"), Query("orders.silver")
    bronze.fail()

    def script() -> None:
        run.clock.now += 61  # ten minutes pass in a few polls

    ending = supervise(
        {"orders.bronze": bronze, "orders.silver": other},
        StopAfter(script),
        run.reporter,
        outages=run.outages,
    )
    assert ending.code == EXIT_FAILED
    stop = ending.stops[0]
    assert stop.reason is StopReason.SOURCE_UNAVAILABLE and stop.reason.final
    assert "stayed unreachable for 10 min (source.unavailable_for)" in stop.message
    assert "did not answer" in stop.message
    assert other.stopped and not run.restarted


def test_an_outage_that_resumes_without_a_batch_keeps_its_start(run: Run) -> None:
    """A broker that flaps (the restarted query fails again before committing anything) does
    not give the flow a fresh ``unavailable_for``."""
    first = Query("orders.bronze")
    first.fail()
    cause = _cause(first)
    assert run.outages.begins("orders.bronze", first, cause)
    since = run.outages.waiting["orders.bronze"].since
    run.clock.now += 100
    run.broker.down = None
    restarted, gave_up = run.outages.tick()
    assert gave_up is None and list(restarted) == ["orders.bronze"]
    run.broker.down = "down again"
    again = restarted["orders.bronze"]
    again.fail()
    assert run.outages.begins("orders.bronze", again, cause)
    assert run.outages.waiting["orders.bronze"].since == since


def test_only_a_source_error_of_a_kafka_flow_that_allows_a_wait_is_waited_for(
    run: Run, flows: Path
) -> None:
    query = Query("orders.bronze")
    query.fail()
    cause = _cause(query)
    assert not run.outages.begins("orders.bronze", query, replace(cause, reason=StopReason.CRASH))
    assert not run.outages.begins("other.bronze", query, cause)  # not a flow of this run
    source = run.spec.source.model_copy(update={"unavailable_for": "0 seconds"})
    no_wait = run.spec.model_copy(update={"source": source})
    outages = SourceOutages({"orders": no_wait}, run.settings, run.reporter, print, run.broker)
    assert not outages.begins("orders.bronze", query, cause)
    assert run.broker.probes == 0


def _cause(query: Query) -> FlowStopped:
    assert query.error is not None
    return failure_stop("orders", query.name, None, query_exception(query), query.error)


def test_a_stop_while_a_query_waits_stops_the_run_on_request(run: Run) -> None:
    """Not one more probe or wait: the run's other queries stop, every flow is recorded as
    stopped on request, and the waiting note goes with the run."""
    bronze, silver = Query("orders.bronze"), Query("orders.silver")
    bronze.fail()

    def script() -> None:
        if run.outages.waiting and not stop.reason:
            stop.request("SIGTERM (a Dagster run terminated)")

    stop = StopAfter(script)
    queries = {"orders.bronze": bronze, "orders.silver": silver}
    ending = supervise(queries, stop, run.reporter, outages=run.outages)
    assert ending.code == EXIT_OK
    assert [s.reason for s in ending.stops] == [StopReason.STOPPED_ON_REQUEST]
    run.reporter.stopped(ending.stops[0])
    assert silver.stopped and run.broker.probes == 1 and not run.restarted
    assert read_status(run.spec, run.settings).supervision is None


def test_a_query_that_ran_a_trigger_after_its_restart_starts_a_fresh_outage(run: Run) -> None:
    """Hours of idle triggers (no batch, but the source answered each) after a restart: the
    next outage has its own ``unavailable_for``."""
    first = Query("orders.bronze")
    first.fail()
    assert run.outages.begins("orders.bronze", first, _cause(first))
    run.broker.down, run.clock.now = None, run.clock.now + 60
    again = run.outages.tick()[0]["orders.bronze"]
    again.recentProgress = [{"batchId": 0, "durationMs": {"latestOffset": 3}}]  # no addBatch
    run.clock.now += 6 * 3600
    run.broker.down = "down again"
    again.fail()
    assert run.outages.begins("orders.bronze", again, _cause(again))
    assert run.outages.waiting["orders.bronze"].since == run.clock.now


def test_another_querys_batch_keeps_the_waiting_note(run: Run) -> None:
    """Silver commits while bronze waits for the broker: the flow still reads "waiting"."""
    bronze = Query("orders.bronze")
    bronze.fail()
    assert run.outages.begins("orders.bronze", bronze, _cause(bronze))
    silver = BatchCommitted(
        flow="orders", stage="silver", batch_id=3, input_rows=10, rows_added=10, replayed=False,
        input_rows_per_second=5.0, processed_rows_per_second=5.0, batch_duration_ms=100,
        end_offsets=None, latest_offsets=None, lag=None, partition_lag=None, delta_version=4,
        timestamp="2026-11-27T12:00:00Z",
    )  # fmt: skip
    run.reporter.batch(silver)
    assert flow_run_state(run.spec, run.settings).phase is Phase.WAITING_FOR_SOURCE

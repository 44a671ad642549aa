"""The runner's supervision loop reports truthfully (no JVM: queries are stand-ins with the same
observable contract as Spark's StreamingQuery: a query that ended is inactive with its exception
already set)."""

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.catalog.state import FlowState
from pipelines.lease import LeaseLostError
from pipelines.messages import FlowStopped, StopReason
from pipelines.progress import BatchFailures
from pipelines.reporting import Reporter
from pipelines.runner import (
    EXIT_FAILED,
    EXIT_LEASE,
    EXIT_OK,
    StopRequest,
    failure_message,
    flows_that_ran,
    supervise,
)
from pipelines.settings import load_settings
from pipelines.silver.expectations import ExpectationFailedError
from pipelines.spec import parse_spec
from pipelines.volumes import DiskFullError, VolumeFull


@dataclass
class EndingQuery:
    """Active for ``active_reads`` reads of ``isActive``, then ended with ``error``."""

    active_reads: int
    error: str | None = None
    reads: int = 0
    stopped: bool = field(default=False)
    lastProgress: Any = None  # noqa: N815 - Spark's attribute name
    recentProgress: list[Any] = field(default_factory=list)  # noqa: N815
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def isActive(self) -> bool:  # noqa: N802
        self.reads += 1
        return self.reads <= self.active_reads and not self.stopped

    def exception(self) -> str | None:
        return self.error if self.reads > self.active_reads else None

    def stop(self) -> None:
        self.stopped = True


def test_a_query_failing_between_the_two_checks_is_a_failure() -> None:
    """The old loop read failures first and "all inactive" second: a failure in between passed
    for a clean exit. ``flaky`` is active on the failure check and has failed by the next read."""
    flaky = EndingQuery(active_reads=1, error="boom")
    ending = supervise({"flaky": flaky}, StopRequest(None), Reporter())
    assert ending.code == EXIT_FAILED
    assert ending.stops == (
        FlowStopped("flaky", StopReason.CRASH, "flow flaky failed: boom", "flaky"),
    )


def test_clean_end_is_ok() -> None:
    ending = supervise({"a": EndingQuery(active_reads=2)}, StopRequest(None), Reporter())
    assert ending.code == EXIT_OK
    assert ending.stops == (FlowStopped("a", StopReason.FINISHED),)


def test_a_stop_request_stops_every_flow_on_request() -> None:
    stop = StopRequest(None)
    stop.request("SIGTERM")
    queries = {"a": EndingQuery(active_reads=99), "b.silver": EndingQuery(active_reads=99)}
    ending = supervise(queries, stop, Reporter())
    assert ending.code == EXIT_OK
    assert [(s.flow, s.reason, s.message) for s in ending.stops] == [
        ("a", StopReason.STOPPED_ON_REQUEST, "SIGTERM"),
        ("b", StopReason.STOPPED_ON_REQUEST, "SIGTERM"),
    ]


def test_a_lost_lease_inside_a_batch_exits_with_the_lease_code() -> None:
    """Known from the exception the batch raised (the side channel), not from Spark's text."""
    failures = BatchFailures()
    failures.record("a", LeaseLostError("flow a: the lease is not held"))
    query = EndingQuery(active_reads=0, error="py4j... an error Spark reworded")
    ending = supervise({"a": query}, StopRequest(None), Reporter(), failures=failures)
    assert ending.code == EXIT_LEASE
    assert ending.stops[0].reason is StopReason.LEASE_LOST
    assert ending.stops[0].message == "flow a failed: LeaseLostError: flow a: the lease is not held"


def test_the_text_of_an_error_never_decides_the_reason() -> None:
    """Spark's text naming a Conflux error is not the error: without the raised exception the
    failure is a crash, whatever the text says."""
    query = EndingQuery(active_reads=0, error="pipelines.lease.LeaseLostError: flow a: lost")
    ending = supervise({"a": query}, StopRequest(None), Reporter())
    assert ending.code == EXIT_FAILED
    assert ending.stops[0].reason is StopReason.CRASH


def test_a_failed_expectation_stops_its_flow_and_the_others_with_it() -> None:
    failures = BatchFailures()
    error = ExpectationFailedError("flow a: silver batch 3: ... [failed expectations: positive]",
                                   names=["positive"])  # fmt: skip
    failures.record("a.silver", error)
    queries = {
        "a.silver": EndingQuery(active_reads=0, error="StreamingQueryException: ..."),
        "b": EndingQuery(active_reads=99),
    }
    ending = supervise(queries, StopRequest(None), Reporter(), failures=failures)
    assert ending.code == EXIT_FAILED
    failed, other = ending.stops
    assert failed == FlowStopped(
        "a",
        StopReason.EXPECTATION_FAILED,
        f"flow a.silver failed: ExpectationFailedError: {error}",
        "a.silver",
        ("positive",),
    )
    assert other == FlowStopped("b", StopReason.OTHER_FLOW_FAILED, failed.message, "a.silver")
    assert queries["b"].stopped


def _guard(tmp_path: Any, owner: str, holder: str | None, released: bool = False) -> Any:
    """A guard of ``owner`` over a lease store whose newest term is ``holder``'s (None: none)."""
    from pipelines.lease import FileLeaseStore, FlowLease, LeaseGuard

    store = FileLeaseStore(tmp_path / "lease")
    if holder is not None:
        lease = FlowLease("a", store, holder, {"host": "h"}, duration=30.0)
        lease.acquire()
        if released:
            lease.release()
    return LeaseGuard("a", store, owner)


def test_a_failure_after_another_owner_took_the_lease_is_the_lost_lease(tmp_path: Any) -> None:
    """A zombie woken past its lease: its commit is refused (the query fails) because the new
    owner made it first. Reported as the lost lease, with the query's own error beside it."""
    guard = _guard(tmp_path, "zombie", holder="new-owner")
    query = EndingQuery(active_reads=0, error="FileAlreadyExistsException: offsets/7")
    ending = supervise({"a": query}, StopRequest(None), Reporter(), guards=[guard])
    assert ending.code == EXIT_LEASE
    assert ending.stops[0].reason is StopReason.LEASE_LOST
    assert "the lease is no longer zombie's" in ending.stops[0].message
    assert "a failed meanwhile: FileAlreadyExistsException: offsets/7" in ending.stops[0].message


def test_a_failure_while_the_lease_is_still_ours_is_the_failure(tmp_path: Any) -> None:
    guard = _guard(tmp_path, "owner", holder="owner")
    ending = supervise({"a": EndingQuery(0, error="boom")}, StopRequest(None), Reporter(), [guard])
    assert ending.code == EXIT_FAILED and ending.stops[0].reason is StopReason.CRASH


def test_a_lease_store_that_fails_one_read_is_ridden_out(tmp_path: Any) -> None:
    from pipelines.lease import LeaseGuard
    from pipelines.runner import lease_problem

    class Unreachable:
        def latest(self) -> None:
            raise OSError("the S3 store at http://s3.test failed: read timeout")

    assert lease_problem([LeaseGuard("a", Unreachable(), "owner")]) is None  # type: ignore[arg-type]


def test_only_a_flow_that_never_ran_failed_to_start(tmp_path: Path) -> None:
    """A failure outside supervision (a write after the queries, Spark not coming up) says
    "failed to start" only of flows whose checkpoint never planned a batch; a full disk is
    named by its volume, not by the Python error."""
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    ran, fresh = (
        parse_spec(
            {"name": name, "source": {"kind": "kafka", "topics": [name]}, "target": {"table": name}}
        )
        for name in ("ran", "fresh")
    )
    offsets = FlowState.of(ran, settings).checkpoint.path / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1")  # what Spark writes when it plans batch 0
    FlowState.of(fresh, settings).checkpoint.path.mkdir(parents=True)  # created, nothing planned
    assert flows_that_ran([ran, fresh], settings) == {"ran"}
    assert flows_that_ran([ran, fresh], None) == set()  # the run never began

    spark = RuntimeError("[DELTA_MISSING_DELTA_TABLE] `/lake/x` is not a Delta table.")
    assert failure_message(["fresh"], set(), spark) == f"flows fresh failed to start: {spark}"
    full = DiskFullError(VolumeFull.at(errno.ENOSPC, "/proc/ck/ran/_status.json"))
    assert failure_message(["ran"], {"ran"}, full) == f"flows ran failed: {full}"
    assert str(full).startswith("disk full on /proc: writing /proc/ck/ran/_status.json failed")
    raw = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/proc/ck/ran/_health.json")
    assert failure_message(["ran", "fresh"], {"ran"}, raw) == (
        "flows ran failed and flows fresh failed to start: disk full on /proc: writing "
        "/proc/ck/ran/_health.json failed (No space left on device); free space there (or move "
        "the flow's tables and state to a larger volume)"
    )

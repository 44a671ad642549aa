"""The runner's supervision loop reports truthfully (no JVM: queries are stand-ins with the same
observable contract as Spark's StreamingQuery: a query that ended is inactive with its exception
already set)."""

from dataclasses import dataclass, field
from typing import Any

from pipelines.reporting import Reporter
from pipelines.runner import EXIT_FAILED, EXIT_LEASE, EXIT_OK, StopRequest, supervise


@dataclass
class EndingQuery:
    """Active for ``active_reads`` reads of ``isActive``, then ended with ``error``."""

    active_reads: int
    error: str | None = None
    reads: int = 0
    stopped: bool = field(default=False)
    lastProgress: Any = None  # noqa: N815 - Spark's attribute name
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
    assert supervise({"flaky": flaky}, StopRequest(None), Reporter()) == EXIT_FAILED


def test_clean_end_is_ok() -> None:
    assert supervise({"a": EndingQuery(active_reads=2)}, StopRequest(None), Reporter()) == EXIT_OK


def test_a_lost_lease_inside_a_batch_exits_with_the_lease_code() -> None:
    query = EndingQuery(active_reads=0, error="LeaseLostError: flow a: the lease is not held")
    assert supervise({"a": query}, StopRequest(None), Reporter()) == EXIT_LEASE

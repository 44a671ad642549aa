"""Source outages ridden out inside the driver: a query that failed because its Kafka brokers
stopped answering waits for them and starts again from its checkpoint in the same Spark
application, with no new JVM and the run's other queries untouched.

Spark's Kafka source gives up on an unreachable broker after its own retries (the driver's offset
fetch: ``fetchOffset.numRetries`` x ``kafka.default.api.timeout.ms``, about 3 minutes by
default), and the query fails with ``source_error``. The runner then asks
:meth:`SourceOutages.begins`:

- the flow's brokers are probed at once with an admin client
  (:func:`pipelines.sources.kafka.broker_unreachable`). If they answer, the failure is not one a
  wait cures (a deleted topic, a refused login): the run fails as any other, and its supervisor
  (``conflux run``'s or Dagster's retry policy) counts a restart;
- otherwise the query waits: the brokers are probed again after 5, 10, 20, then every 30 s
  (:data:`PROBE_BACKOFF`), and the flow's status file carries a
  :class:`~pipelines.status.SupervisorNote` naming the query, so its state reads "waiting for
  source" (since when, the last error, the next probe, when it gives up);
- once they answer, :meth:`SourceOutages.tick` starts the query again (no restart is counted)
  and clears the note; past ``source.unavailable_for`` since the outage began, the flow fails
  with ``source_unavailable``, which no supervisor restarts (the wait was the restart).

An outage's start is kept across a restart that fails again before completing one trigger (the
source never answered the query itself), so a broker that flaps does not extend the wait
forever. A status file that cannot be written (its disk is full) is said, not raised: the wait
goes on, the state just does not show it. Works the same under Dagster and
``conflux run``: both launch this runner.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from pyspark.sql.streaming import StreamingQuery

from pipelines.messages import FlowStopped, StopReason
from pipelines.progress import flow_of_query
from pipelines.reporting import Reporter
from pipelines.settings import Settings
from pipelines.sources.kafka import broker_unreachable
from pipelines.spec import FlowSpec, KafkaSource, duration_seconds
from pipelines.status import Supervision, SupervisorNote
from pipelines.timestamps import iso_utc

#: Seconds between probes of an unreachable source: 5, 10, 20, then every 30.
PROBE_BACKOFF = (5.0, 10.0, 20.0, 30.0)

Probe = Callable[[KafkaSource, Settings], "str | None"]


def never_reached_source(query: StreamingQuery) -> bool:
    """Whether ``query`` (started again after an outage) failed before completing one trigger:
    each trigger, even one that finds no data, asks the source for its offsets first."""
    return query.lastProgress is None and not query.recentProgress


def probe_pause(probes: int) -> float:
    """Seconds before the next probe, after ``probes`` probes since the outage began."""
    return PROBE_BACKOFF[min(probes, len(PROBE_BACKOFF) - 1)]


@dataclass(frozen=True)
class Outage:
    """One query waiting for its source: since when, until when, its next probe and what the
    last one said (the failure's own first line, until a probe says more)."""

    query: str
    flow: str
    since: float
    give_up_at: float
    next_probe: float
    probes: int
    error: str
    unavailable_for: float


class SourceOutages:
    """The queries of a run that wait for their source (see the module doc).

    ``restart(query)`` starts a query again from its checkpoint and returns it; ``probe`` says
    why a Kafka source is unreachable (None: it answers).
    """

    def __init__(
        self,
        specs: Mapping[str, FlowSpec],
        settings: Settings,
        reporter: Reporter,
        restart: Callable[[str], StreamingQuery],
        probe: Probe = broker_unreachable,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.specs, self.settings, self.reporter = specs, settings, reporter
        self._restart, self._probe, self._clock = restart, probe, clock
        self.waiting: dict[str, Outage] = {}
        #: Queries started again after an outage: since when that outage ran.
        self._resumed: dict[str, float] = {}

    def begins(self, query: str, failed: StreamingQuery, cause: FlowStopped) -> bool:
        """Whether ``query``'s failure (``cause``) is an outage to wait out here: a source error
        of a Kafka flow with ``source.unavailable_for`` > 0 whose brokers do not answer now."""
        spec = self.specs.get(flow_of_query(query))
        if spec is None or cause.reason is not StopReason.SOURCE_ERROR:
            return False
        source = spec.source
        if not isinstance(source, KafkaSource) or duration_seconds(source.unavailable_for) <= 0:
            return False
        why = self._probe(source, self.settings)
        if why is None:
            return False  # it answers: a failure a wait does not cure
        now = self._clock()
        resumed = self._resumed.pop(query, None)
        since = resumed if resumed is not None and never_reached_source(failed) else now
        patience = duration_seconds(source.unavailable_for)
        outage = Outage(
            query,
            spec.name,
            since,
            give_up_at=since + patience,
            next_probe=now + probe_pause(0),
            probes=0,
            error=f"{cause.first_line} [{cause.reason.value}]",
            unavailable_for=patience,
        )
        self._wait(outage)
        return True

    def tick(self) -> tuple[dict[str, StreamingQuery], FlowStopped | None]:
        """Probe the sources whose next probe is due: the queries started again because their
        source answers, and the stop of a flow whose source stayed unreachable too long."""
        restarted: dict[str, StreamingQuery] = {}
        for outage in list(self.waiting.values()):
            if self._clock() < outage.next_probe:
                continue
            spec = self.specs[outage.flow]
            assert isinstance(spec.source, KafkaSource)
            why = self._probe(spec.source, self.settings)
            if why is None:
                restarted[outage.query] = self._resume(outage)
                continue
            outage = replace(outage, probes=outage.probes + 1, error=why)
            if self._clock() >= outage.give_up_at:
                return restarted, self._give_up(outage)
            self._wait(outage)
        return restarted, None

    def _wait(self, outage: Outage) -> None:
        now = self._clock()
        next_probe = max(now, min(now + probe_pause(outage.probes), outage.give_up_at))
        outage = replace(outage, next_probe=next_probe)
        self.waiting[outage.query] = outage
        spec = self.specs[outage.flow]
        self._note_state(outage.flow, self._note(spec, outage))
        self.reporter.info(
            f"{outage.query}: waiting for the source since {iso_utc(outage.since)}: "
            f"{outage.error}; next probe {iso_utc(next_probe)}, gives up at "
            f"{iso_utc(outage.give_up_at)}"
        )

    def _resume(self, outage: Outage) -> StreamingQuery:
        del self.waiting[outage.query]
        self.reporter.info(
            f"{outage.query}: the source answers again: restarting the query from its checkpoint "
            "in this application"
        )
        query = self._restart(outage.query)
        self._resumed[outage.query] = outage.since
        if not any(o.flow == outage.flow for o in self.waiting.values()):
            self._note_state(outage.flow, None)
        return query

    def _note_state(self, flow: str, note: SupervisorNote | None) -> None:
        try:
            self.reporter.supervising(flow, note)
        except OSError as exc:
            self.reporter.info(f"flow {flow}: its state could not be recorded: {exc}")

    def _give_up(self, outage: Outage) -> FlowStopped:
        del self.waiting[outage.query]
        message = (
            f"flow {outage.query} failed: the source stayed unreachable for "
            f"{outage.unavailable_for / 60:.0f} min "
            f"(source.unavailable_for): {outage.error}"
        )
        self.reporter.error(message)
        return FlowStopped(outage.flow, StopReason.SOURCE_UNAVAILABLE, message, outage.query)

    def _note(self, spec: FlowSpec, outage: Outage) -> SupervisorNote:
        return SupervisorNote(
            state=Supervision.WAITING_FOR_SOURCE,
            attempt=0,
            max_restarts=spec.trigger.max_restarts,
            since=iso_utc(outage.since),
            next_try_at=iso_utc(outage.next_probe),
            give_up_at=iso_utc(outage.give_up_at),
            last_error=outage.error,
            host=socket.gethostname(),
            pid=os.getpid(),
            query=outage.query,
        )

"""Supervision outside Dagster: ``conflux run`` of a continuous flow starts its Spark application
again when it fails, as the flow asset's retry policy does under Dagster, and rides out an
unreachable source.

After an application ends, its flows' status files say why (:class:`~pipelines.messages.FlowStopped`;
none: it was killed) and :meth:`Supervisor.next_step` decides:

- **done**: it ended cleanly (exit 0: caught up, or stopped on request), the user stopped
  ``conflux run``, or a restart is no cure: a misconfiguration (exit 2), a lease another owner holds
  (exit 3), a refusal the spec asked for (an expectation, a schema change: the same batch would
  fail again);
- **wait for the source** (``source_error``): the brokers are probed with an admin client
  (:func:`pipelines.sources.kafka.broker_unreachable`), with backoff (5, 10, 20, 30, 30, ... s), until
  they answer, then the application starts again without counting a restart; past
  ``source.unavailable_for`` the flow fails with that reason;
- **restart** anything else (a crash, ``kill -9``, a full disk freed meanwhile...): attempt n of
  ``trigger.max_restarts`` after ``trigger.restart_delay`` x (2^n - 1), Dagster's exponential
  backoff (1, 3, 7, ... times the delay).

Meanwhile a :class:`~pipelines.messages.SupervisorNote` in each flow's status file tells the flow's
state (:mod:`pipelines.run_state`): restarting (attempt n of m, next try at) or waiting for its
source (since when, the last error), so ``conflux status`` and the Dagster check say it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum

from pipelines.catalog.state import FlowState, write_json_atomically
from pipelines.messages import FlowStopped, StopReason
from pipelines.run_state import read_status
from pipelines.runner import EXIT_CONFIG, EXIT_FAILED, EXIT_LEASE, EXIT_OK
from pipelines.settings import Settings
from pipelines.sources.kafka import broker_unreachable
from pipelines.spec import FlowSpec, KafkaSource, duration_seconds
from pipelines.status import FlowStatus, Supervision, SupervisorNote
from pipelines.stopping import requester

#: Seconds between probes of an unreachable source: 5, 10, 20, then every 30.
PROBE_BACKOFF = (5.0, 10.0, 20.0, 30.0)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RestartPolicy:
    """How often and when a run's application starts again; one application runs every flow of a
    ``conflux run``, so the strictest of their specs' values applies."""

    max_restarts: int
    restart_delay: float
    unavailable_for: float

    @classmethod
    def of(cls, specs: Sequence[FlowSpec]) -> RestartPolicy:
        kafka = [s.source for s in specs if isinstance(s.source, KafkaSource)]
        return cls(
            max_restarts=min(s.trigger.max_restarts for s in specs),
            restart_delay=max(duration_seconds(s.trigger.restart_delay) for s in specs),
            unavailable_for=min((duration_seconds(k.unavailable_for) for k in kafka), default=0.0),
        )

    def delay(self, attempt: int) -> float:
        """Seconds before restart ``attempt`` (1-based): Dagster's exponential backoff."""
        return self.restart_delay * (2**attempt - 1)


@dataclass(frozen=True)
class Attempt:
    """How one application of the run ended: its exit code (128 + n: killed by signal n), its
    lease owner, and whether the user asked ``conflux run`` to stop meanwhile."""

    code: int
    owner: str
    interrupted: bool = False


class Action(StrEnum):
    """What the supervisor does after an application ended."""

    DONE = "done"
    WAIT_FOR_SOURCE = "wait for the source"
    RESTART = "restart"


@dataclass(frozen=True)
class Step:
    """What :meth:`Supervisor.next_step` decided, the failure's reason and its first line."""

    action: Action
    reason: StopReason
    cause: str


class Supervisor:
    """Starts a continuous run's application again until it ends for good (see the module doc).

    ``start`` runs one application to its end; ``wait(seconds)`` sleeps, returning True when the
    user asked to stop meanwhile; ``probe`` says why a Kafka source is unreachable (None: it
    answers).
    """

    def __init__(
        self,
        specs: Sequence[FlowSpec],
        settings: Settings,
        wait: Callable[[float], bool],
        probe: Callable[[KafkaSource, Settings], str | None] = broker_unreachable,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.specs, self.settings = list(specs), settings
        self.policy = RestartPolicy.of(self.specs)
        self._wait, self._probe, self._clock = wait, probe, clock

    def run(self, start: Callable[[], Attempt], say: Callable[[str], None]) -> int:
        """Start, and start again while :meth:`next_step` says so; the last exit code, or
        ``EXIT_FAILED`` when it gave up."""
        restarts = 0
        while True:
            attempt = start()
            step = self.next_step(attempt)
            if step.action is Action.DONE:
                return attempt.code
            if step.action is Action.WAIT_FOR_SOURCE:
                if not self._wait_for_source(attempt, step, say):
                    return EXIT_FAILED if not attempt.interrupted else EXIT_OK
                continue
            restarts += 1
            if restarts > self.policy.max_restarts:
                say(f"giving up after {self.policy.max_restarts} restart(s): {step.cause}")
                return attempt.code
            delay = self.policy.delay(restarts)
            now = self._clock()
            self._note(attempt, Supervision.RESTARTING, restarts, now, now + delay, step.cause)
            say(
                f"{step.cause}; restart {restarts} of {self.policy.max_restarts} in {delay:.0f} s "
                f"(at {_iso(now + delay)})"
            )
            if self._wait(delay):
                self._stopped_meanwhile(attempt)
                return EXIT_OK

    def next_step(self, attempt: Attempt) -> Step:
        """Done, wait for the source, or restart, from how ``attempt`` ended (module doc)."""
        records = self._records(attempt.owner)
        if attempt.interrupted or attempt.code in (EXIT_OK, EXIT_CONFIG, EXIT_LEASE):
            return Step(Action.DONE, StopReason.FINISHED, "")
        failures = [r for r in records if r.reason is not StopReason.OTHER_FLOW_FAILED]
        if not failures:
            cause = (
                f"its application exited with code {attempt.code} without recording why "
                "(killed, or out of memory)"
            )
            return Step(Action.RESTART, StopReason.CRASH, cause)
        first = failures[0]
        line = first.message.strip().splitlines()[0] if first.message.strip() else ""
        cause = f"flow {first.flow} failed: {first.reason.value}" + (f": {line}" if line else "")
        if any(r.reason.repeats_on_restart for r in failures):
            return Step(Action.DONE, first.reason, cause)
        if first.reason is StopReason.SOURCE_ERROR and self.policy.unavailable_for > 0:
            return Step(Action.WAIT_FOR_SOURCE, first.reason, cause)
        return Step(Action.RESTART, first.reason, cause)

    def _wait_for_source(self, attempt: Attempt, step: Step, say: Callable[[str], None]) -> bool:
        """Probe until every Kafka source answers (True) or ``unavailable_for`` passed, or the
        user stopped the run (False; the flow's end is recorded)."""
        since = self._clock()
        give_up_at = since + self.policy.unavailable_for
        error, probes = step.cause, 0
        while True:
            pause = PROBE_BACKOFF[min(probes, len(PROBE_BACKOFF) - 1)]
            next_try = min(self._clock() + pause, give_up_at)
            self._note(attempt, Supervision.WAITING_FOR_SOURCE, 0, since, next_try, error,
                       give_up_at)  # fmt: skip
            say(f"waiting for the source since {_iso(since)}: {error}; next probe {_iso(next_try)}")
            if self._wait(max(0.0, next_try - self._clock())):
                self._stopped_meanwhile(attempt)
                return False
            probes += 1
            unreachable = [why for why in map(self._probe_one, self.specs) if why]
            if not unreachable:
                say("the source answers again: starting the flows")
                return True
            error = unreachable[0]
            if self._clock() >= give_up_at:
                minutes = self.policy.unavailable_for / 60
                message = f"the source stayed unreachable for {minutes:.0f} min: {error}"
                say(message)
                self._ended(attempt, StopReason.SOURCE_ERROR, message, EXIT_FAILED)
                return False

    def _probe_one(self, spec: FlowSpec) -> str | None:
        if not isinstance(spec.source, KafkaSource):
            return None
        return self._probe(spec.source, self.settings)

    def _records(self, owner: str) -> list[FlowStopped]:
        found = []
        for spec in self.specs:
            status = read_status(spec, self.settings)
            if status.owner == owner and status.stopped is not None:
                found.append(status.stopped)
        return found

    def _rewrite(
        self, attempt: Attempt, change: Callable[[FlowSpec, FlowStatus], FlowStatus]
    ) -> None:
        """Rewrite each flow's status file as ``attempt``'s owner left it, changed."""
        for spec in self.specs:
            status = read_status(spec, self.settings)
            if status.owner != attempt.owner:  # it recorded nothing: a killed application
                status = FlowStatus(attempt.owner, status.last_batch)
            status_file = FlowState.of(spec, self.settings).status_file
            write_json_atomically(status_file, change(spec, status).to_json())

    def _note(
        self,
        attempt: Attempt,
        state: Supervision,
        restart: int,
        since: float,
        next_try: float,
        error: str,
        give_up_at: float | None = None,
    ) -> None:
        note = SupervisorNote(
            state=state,
            attempt=restart,
            max_restarts=self.policy.max_restarts,
            since=_iso(since),
            next_try_at=_iso(next_try),
            give_up_at=_iso(give_up_at if give_up_at is not None else next_try),
            last_error=error,
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        self._rewrite(attempt, lambda _spec, status: replace(status, supervision=note))

    def _ended(self, attempt: Attempt, reason: StopReason, message: str, code: int) -> None:
        """The supervision ended the flows (gave up, or was stopped): each flow's record."""

        def end(spec: FlowSpec, status: FlowStatus) -> FlowStatus:
            record = FlowStopped(spec.name, reason, message, exit_code=code)
            return replace(status, stopped=record, supervision=None)

        self._rewrite(attempt, end)

    def _stopped_meanwhile(self, attempt: Attempt) -> None:
        by = requester("Ctrl-C to conflux run, while it waited to start the flows again")
        self._ended(attempt, StopReason.STOPPED_ON_REQUEST, by, EXIT_OK)

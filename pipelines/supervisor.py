"""Supervision outside Dagster: ``conflux run`` of a continuous flow starts its Spark application
again when it fails, as the flow asset's retry policy does under Dagster, and rides out an
unreachable source.

After an application ends, its flows' status files say why
(:class:`~pipelines.messages.FlowStopped`; none: it was killed) and :meth:`Supervisor.next_step`
decides:

- **done**: it ended cleanly (exit 0: caught up, or stopped on request), the user stopped
  ``conflux run``, or a restart is no cure: a misconfiguration (exit 2), a lease another owner holds
  (exit 3), a refusal the spec asked for (an expectation, a schema change: the same batch would
  fail again), a source that stayed unreachable past ``source.unavailable_for`` in the
  application (``source_unavailable``: it already waited);
- **wait for the source** (``source_error``): the brokers are probed with an admin client
  (:func:`pipelines.sources.kafka.broker_unreachable`), with backoff (5, 10, 20, 30, 30, ...
  s), until they answer, then the application starts again without counting a restart (a
  failure the first probe does not see, e.g. a deleted topic, is restarted as below); past
  ``source.unavailable_for`` the flow fails with ``source_unavailable``. This is the fallback
  for a source error the application did not wait out itself (:mod:`pipelines.outages`: its
  brokers answered its probe, or the flow failed before its queries ran);
- **restart** anything else (a crash, ``kill -9``, a full disk freed meanwhile...): attempt n of
  ``trigger.max_restarts`` after ``trigger.restart_delay`` x (2^n - 1), Dagster's exponential
  backoff (1, 3, 7, ... times the delay).

Meanwhile a :class:`~pipelines.messages.SupervisorNote` in each flow's status file tells the flow's
state (:mod:`pipelines.run_state`): restarting (attempt n of m, next try at) or waiting for its
source (since when, the last error), so ``conflux status`` and the Dagster check say it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from functools import partial

from pipelines.catalog.state import FlowState
from pipelines.messages import FlowStopped, StopReason
from pipelines.outages import probe_pause
from pipelines.runner import EXIT_CONFIG, EXIT_FAILED, EXIT_LEASE, EXIT_OK
from pipelines.settings import Settings
from pipelines.sources.kafka import broker_unreachable
from pipelines.spec import FlowSpec, KafkaSource, duration_seconds
from pipelines.status import (
    FlowStatus,
    Supervision,
    SupervisorNote,
    read_status,
    write_status,
)
from pipelines.stopping import requester
from pipelines.timestamps import iso_utc


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


class Waited(Enum):
    """How a wait for the source ended."""

    ANSWERED = "the source answered"
    ANSWERED_AT_ONCE = "the source answered the first probe"
    GAVE_UP = "gave up"
    STOPPED = "stopped on request"


class TakenOverError(RuntimeError):
    """Another owner took a flow's lease while the supervisor waited: the flow is theirs."""


class Supervisor:
    """Starts a continuous run's application again until it ends for good (see the module doc).

    ``start`` runs one application to its end; ``wait(seconds)`` sleeps, returning True when the
    user asked to stop (at once for ``wait(0)``); ``probe`` says why a Kafka source is
    unreachable (None: it answers). A healthy stretch (an attempt that committed a batch) gives
    the next failure a fresh budget of restarts and of ``unavailable_for``.
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
        self._say: Callable[[str], None] = print

    def run(self, start: Callable[[], Attempt], say: Callable[[str], None]) -> int:
        """Start, and start again while :meth:`next_step` says so; the last exit code,
        ``EXIT_FAILED`` when it gave up, ``EXIT_LEASE`` when another owner took a flow over."""
        self._say = say
        try:
            return self._supervise(start)
        except TakenOverError as exc:
            say(str(exc))
            return EXIT_LEASE

    def _supervise(self, start: Callable[[], Attempt]) -> int:
        restarts, outage_since, attempt = 0, None, None
        while True:
            if self._wait(0):  # asked to stop while probing, or before the first start
                if attempt is not None:
                    self._stopped_meanwhile(attempt)
                return EXIT_OK
            before = self._last_batches()
            attempt = start()
            if self._last_batches() != before:  # it ran a while: a fresh budget
                restarts, outage_since = 0, None
            step = self.next_step(attempt)
            if step.action is Action.DONE:
                return attempt.code
            if step.action is Action.WAIT_FOR_SOURCE:
                outage_since = outage_since or self._clock()
                waited = self._wait_for_source(attempt, step, outage_since)
                if waited is Waited.STOPPED:
                    return EXIT_OK
                if waited is Waited.GAVE_UP:
                    return EXIT_FAILED
                if waited is Waited.ANSWERED:
                    continue  # an outage ridden out: no restart counted
                # Answered at once: a source failure the probe does not see (a deleted topic, a
                # refused login): restarted like any other, so it ends after max_restarts.
            restarts += 1
            if restarts > self.policy.max_restarts:
                message = f"gave up after {self.policy.max_restarts} restart(s): {step.cause}"
                self._say(message)
                self._ended(attempt, step.reason, message, attempt.code)
                return attempt.code
            if self._restart_after(attempt, step, restarts):
                return EXIT_OK

    def _restart_after(self, attempt: Attempt, step: Step, restart: int) -> bool:
        """Note and wait out restart ``restart``'s delay; True if the user stopped meanwhile."""
        delay, now = self.policy.delay(restart), self._clock()
        note = self._note_of(Supervision.RESTARTING, restart, now, now + delay, step.cause)
        self._write_note(attempt, note)
        self._say(
            f"{step.cause}; restart {restart} of {self.policy.max_restarts} in {delay:.0f} s "
            f"(at {iso_utc(now + delay)})"
        )
        if self._wait(delay) or self._wait(0):
            self._stopped_meanwhile(attempt)
            return True
        return False

    def next_step(self, attempt: Attempt) -> Step:
        """Done, wait for the source, or restart, from how ``attempt`` ended (module doc)."""
        if attempt.interrupted or attempt.code in (EXIT_OK, EXIT_CONFIG, EXIT_LEASE):
            return Step(Action.DONE, StopReason.FINISHED, "")
        failures = [
            r for r in self._records(attempt.owner) if r.reason is not StopReason.OTHER_FLOW_FAILED
        ]
        if not failures:
            return Step(Action.RESTART, StopReason.CRASH, unrecorded_exit(attempt.code))
        first = failures[0]
        cause = f"{first.first_line or f'flow {first.flow} failed'} [{first.reason.value}]"
        if any(r.reason.final for r in failures):
            return Step(Action.DONE, first.reason, cause)
        if first.reason is StopReason.SOURCE_ERROR and self.policy.unavailable_for > 0:
            return Step(Action.WAIT_FOR_SOURCE, first.reason, cause)
        return Step(Action.RESTART, first.reason, cause)

    def _wait_for_source(self, attempt: Attempt, step: Step, since: float) -> Waited:
        """Probe until every Kafka source answers, ``unavailable_for`` since ``since`` passed, or
        the user stopped the run (then the flow's end is recorded)."""
        give_up_at = since + self.policy.unavailable_for
        error, probes = step.cause, 0
        while True:
            pause = probe_pause(probes)
            next_try = max(self._clock(), min(self._clock() + pause, give_up_at))
            note = self._note_of(Supervision.WAITING_FOR_SOURCE, 0, since, next_try, error)
            self._write_note(attempt, replace(note, give_up_at=iso_utc(give_up_at)))
            self._say(
                f"waiting for the source since {iso_utc(since)}: {error}; next probe "
                f"{iso_utc(next_try)}"
            )
            if self._wait(next_try - self._clock()) or self._wait(0):
                self._stopped_meanwhile(attempt)
                return Waited.STOPPED
            probes += 1
            unreachable = [why for why in map(self._probe_one, self.specs) if why]
            if not unreachable:
                self._say("the source answers again: starting the flows")
                return Waited.ANSWERED_AT_ONCE if probes == 1 else Waited.ANSWERED
            error = unreachable[0]
            if self._clock() >= give_up_at:
                minutes = self.policy.unavailable_for / 60
                message = (
                    f"the source stayed unreachable for {minutes:.0f} min "
                    f"(source.unavailable_for): {error}"
                )
                self._say(message)
                self._ended(attempt, StopReason.SOURCE_UNAVAILABLE, message, EXIT_FAILED)
                return Waited.GAVE_UP

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

    def _last_batches(self) -> list[str | None]:
        """Each flow's last committed batch (its time): changed, the attempt made progress."""
        batches = [read_status(spec, self.settings).last_batch for spec in self.specs]
        return [None if b is None else f"{b.stage} {b.batch_id} {b.timestamp}" for b in batches]

    def _note_of(
        self, state: Supervision, restart: int, since: float, next_try: float, error: str
    ) -> SupervisorNote:
        return supervisor_note(state, restart, self.policy, since, next_try, error, os.getpid())

    def _write_note(self, attempt: Attempt, note: SupervisorNote) -> None:
        self._rewrite(attempt, lambda _spec, status: replace(status, supervision=note))

    def _ended(self, attempt: Attempt, reason: StopReason, message: str, code: int) -> None:
        """The supervision ended the flows (gave up, or was stopped): each flow's record."""

        def end(spec: FlowSpec, status: FlowStatus) -> FlowStatus:
            record = FlowStopped(spec.name, reason, message, exit_code=code)
            return replace(status, stopped=record, supervision=None)

        self._rewrite(attempt, end)

    def _stopped_meanwhile(self, attempt: Attempt) -> None:
        by = requester("a stop of conflux run (Ctrl-C, SIGTERM) while it waited to start again")
        self._ended(attempt, StopReason.STOPPED_ON_REQUEST, by, EXIT_OK)

    def _rewrite(
        self, attempt: Attempt, change: Callable[[FlowSpec, FlowStatus], FlowStatus]
    ) -> None:
        """Rewrite each flow's status file as ``attempt``'s owner left it, changed: only while
        that owner's term is the lease's latest (else another run took the flow over). A write
        that fails (the status file's disk is full) is said, not raised: the supervision goes
        on, the state just does not show it."""
        for spec in self.specs:
            state = FlowState.of(spec, self.settings)
            term = state.lease_store().latest()
            if term is not None and term.owner != attempt.owner:
                raise TakenOverError(
                    f"flow {spec.name} was taken over by {term.owner}: conflux run stops "
                    "supervising it"
                )
            try:
                write_status(spec, self.settings, attempt.owner, partial(change, spec))
            except OSError as exc:
                self._say(f"flow {spec.name}: its state could not be recorded: {exc}")


def supervisor_note(
    state: Supervision,
    restart: int,
    policy: RestartPolicy,
    since: float,
    next_try: float,
    error: str,
    pid: int,
) -> SupervisorNote:
    """A note of the supervisor ``pid`` of this host: its next step at ``next_try``."""
    return SupervisorNote(
        state=state,
        attempt=restart,
        max_restarts=policy.max_restarts,
        since=iso_utc(since),
        next_try_at=iso_utc(next_try),
        give_up_at=iso_utc(next_try),
        last_error=error,
        host=socket.gethostname(),
        pid=pid,
    )


def note_pending_restart(
    specs: Sequence[FlowSpec], settings: Settings, owner: str, restart: int, cause: str, pid: int
) -> None:
    """Another supervisor (Dagster's retry policy, run by the process ``pid``) starts the
    application of ``owner`` again as restart ``restart``, after the same backoff: the flows'
    state says so. Nothing is noted past ``max_restarts`` (no restart follows), and a note that
    cannot be written (a full disk) is skipped: the restart does not depend on it."""
    policy = RestartPolicy.of(specs)
    if restart > policy.max_restarts:
        return
    now = time.time()
    note = supervisor_note(
        Supervision.RESTARTING, restart, policy, now, now + policy.delay(restart), cause, pid
    )
    for spec in specs:
        with contextlib.suppress(OSError):
            write_status(spec, settings, owner, lambda status: replace(status, supervision=note))


def unrecorded_exit(code: int) -> str:
    """Why an application that recorded nothing ended, from its exit code."""
    if code > 128:
        name = signal.Signals(code - 128).name if code - 128 in _SIGNALS else str(code - 128)
        return f"its application was killed by {name} (exit code {code}) without recording why"
    return f"its application exited with code {code} without recording why"


_SIGNALS = {int(s) for s in signal.Signals}

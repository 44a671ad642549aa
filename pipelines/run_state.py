"""A flow's state as an operator reads it: one model for ``conflux flows``, ``conflux status``,
the Dagster ``stream_health`` check and its sensor, so the three never disagree.

The state is read from the flow's files alone, so it is the same whoever launched the flow (a
terminal, Dagster, a cluster): the latest lease term (who runs it; live, expired or released),
the status file (the last committed batch, and how the lease owner's run ended: a
:class:`~pipelines.messages.FlowStopped` record) and the heartbeat (each query's last event and
lag: :mod:`pipelines.health`). A supervisor that will start a failed application again says so
in the status file (a :class:`~pipelines.status.SupervisorNote`).

- **never run**: no lease term.
- **running**: the owner's run recorded no end and its lease is live; the heartbeat's verdict
  (healthy, starting, stalled, stale) is the running flow's health. A stale heartbeat whose
  process is gone is not running: the application died and its lease has yet to expire.
- **stopping**: its queries stopped; the record of how follows once Spark is down;
- **restarting**: the application is down and its supervisor starts it again: ``conflux run``'s
  (:mod:`pipelines.supervisor`) or Dagster's retry policy (``assets/launch.py``), whose note in
  the status file says which attempt of how many, and when;
- **waiting for source**: a query whose broker stopped answering waits inside its application
  (:mod:`pipelines.outages`), or ``conflux run``'s supervisor waits before starting the
  application again; either probes the broker (since when, the last error, when it gives up).
- **failed**: the run recorded a failure (its typed reason, the first line of the cause, when,
  the exit code); or it recorded nothing and is gone (lease expired or released, or its process
  gone): killed (``kill -9``, out of memory) or its host lost, reason ``crash``.
- **stopped**: the run recorded a clean end: caught up (``available_now``), or asked to stop
  (the record names who asked).

Lag is known only while the flow runs (its heartbeat's, per query); otherwise it is unknown, never
0: the last batch's lag was true when that batch committed, not now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pipelines.catalog.state import FlowState
from pipelines.health import Health, assess, read_health
from pipelines.lease import LeaseTerm, owner_process_gone, process_gone
from pipelines.messages import FlowStopped, StopReason
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, duration_seconds
from pipelines.status import FlowStatus, Supervision, SupervisorNote, read_status
from pipelines.timestamps import epoch_of


class Phase(StrEnum):
    """Where a flow is in its life (see the module doc)."""

    NEVER_RUN = "never run"
    RUNNING = "running"
    STOPPING = "stopping"
    WAITING_FOR_SOURCE = "waiting for source"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


#: The clean ends of a run; every other :class:`StopReason` is a failure.
CLEAN_ENDS = frozenset({StopReason.FINISHED, StopReason.STOPPED_ON_REQUEST})

#: How an operator reads each reason in one line (the record's message carries the detail).
REASON_TEXT: dict[StopReason, str] = {
    StopReason.FINISHED: "caught up with its source",
    StopReason.STOPPED_ON_REQUEST: "stopped on request",
    StopReason.EXPECTATION_FAILED: "an expectation failed",
    StopReason.SCHEMA_CHANGE_REFUSED: "a schema change was refused",
    StopReason.TRANSFORM_FAILED: "the transform failed",
    StopReason.LEASE_LOST: "its lease was lost",
    StopReason.LEASE_HELD: "another owner held its lease",
    StopReason.CONFIG_ERROR: "misconfiguration",
    StopReason.SOURCE_ERROR: "source unreachable or failing",
    StopReason.SOURCE_UNAVAILABLE: "source unreachable for longer than source.unavailable_for",
    StopReason.DISK_FULL: "disk full",
    StopReason.OTHER_FLOW_FAILED: "another flow of its application failed",
    StopReason.CRASH: "crash",
}

#: How long past its next step a supervisor's note is believed (it rewrites the note at each
#: step; a supervisor on another host that died leaves one behind).
NOTE_GRACE_SECONDS = 120.0

#: Why a run that recorded no end is gone.
NO_RECORD = (
    "its application ended without recording why: killed (kill -9, out of memory) or its host "
    "was lost"
)


@dataclass(frozen=True)
class RunState:
    """A flow's state now: its phase, one line saying it, and what the phase knows."""

    phase: Phase
    summary: str
    owner: str | None = None
    #: running: the heartbeat's verdict on the running application.
    health: Health | None = None
    #: failed / stopped: the run's record (None when it recorded none).
    stopped: FlowStopped | None = None
    #: failed: why, typed (``crash`` for a run gone without a record).
    reason: StopReason | None = None
    #: Per query, while running and known; None: unknown.
    lag: dict[str, int] | None = None

    @property
    def token(self) -> str:
        """One word for a table cell, a sensor's tick: the health of a running flow (healthy,
        starting, stalled, stale), else the phase."""
        return self.health.state if self.health is not None else self.phase.value

    @property
    def short(self) -> str:
        """The state in a few words, for a table of flows (``conflux flows``)."""
        if self.phase is Phase.RUNNING:
            return f"running: {self.token}"
        if self.stopped is not None:
            return f"{self.phase.value}: {REASON_TEXT[self.stopped.reason]}"
        if self.reason is not None:
            return f"{self.phase.value}: {REASON_TEXT[self.reason]}"
        return self.phase.value

    @property
    def cause(self) -> str | None:
        """The first line of what the run recorded (a failure's error, who asked to stop)."""
        return (self.stopped.first_line or None) if self.stopped is not None else None

    @property
    def ok(self) -> bool:
        """Nothing for an operator to act on: running healthy, stopping, stopped cleanly."""
        if self.phase is Phase.RUNNING:
            return self.health is not None and self.health.healthy
        return self.phase in (Phase.STOPPING, Phase.STOPPED, Phase.NEVER_RUN)

    def lag_text(self) -> str:
        """The flow's lag for a table cell: the queries' total, or ``unknown``."""
        if self.phase is Phase.NEVER_RUN:
            return "-"
        if not self.lag:
            return "unknown"
        return str(sum(self.lag.values()))

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "state": self.token,
            "summary": self.summary,
            "owner": self.owner,
            "reason": None if self.reason is None else self.reason.value,
            "cause": self.cause,
            "at": None if self.stopped is None else self.stopped.at or None,
            "exit_code": None if self.stopped is None else self.stopped.exit_code,
            "lag": self.lag,
            "health": None if self.health is None else self.health.metadata(),
        }


def _ended(term: LeaseTerm, record: FlowStopped) -> RunState:
    """The run of ``term``'s owner recorded its end."""
    when = f" at {record.at}" if record.at else ""
    code = f", exit code {record.exit_code}" if record.exit_code is not None else ""
    first = record.first_line
    if record.reason in CLEAN_ENDS:
        by = f" by {first}" if record.reason is StopReason.STOPPED_ON_REQUEST and first else ""
        summary = f"stopped{when}: {REASON_TEXT[record.reason]}{by}"
        return RunState(Phase.STOPPED, summary, term.owner, stopped=record)
    summary = f"failed{when}{code}: {REASON_TEXT[record.reason]}" + (f": {first}" if first else "")
    return RunState(Phase.FAILED, summary, term.owner, stopped=record, reason=record.reason)


def _note_applies(note: SupervisorNote | None, term: LeaseTerm, now: float) -> bool:
    """A supervisor's note tells the state while its supervisor lives (on this host: its pid) and
    its next step is not long overdue (a supervisor elsewhere that died), and: the lease it
    followed is no longer held (an application-level restart), or is held (a query waiting
    inside its running application, :mod:`pipelines.outages`)."""
    if note is None or term.live(now) != (note.query is not None):
        return False
    if process_gone(note.host, note.pid):
        return False
    due = epoch_of(note.next_try_at)
    return due is None or now <= due + NOTE_GRACE_SECONDS


def _supervised(term: LeaseTerm, note: SupervisorNote, record: FlowStopped | None) -> RunState:
    """A supervisor (``conflux run``'s, or Dagster's retry policy) restarts the application, or
    waits for the source."""
    if note.state is Supervision.WAITING_FOR_SOURCE:
        summary = (
            f"waiting for source since {note.since}: {note.last_error} (next probe "
            f"{note.next_try_at}; gives up at {note.give_up_at})"
        )
        return RunState(Phase.WAITING_FOR_SOURCE, summary, term.owner, stopped=record)
    summary = (
        f"restarting: attempt {note.attempt} of {note.max_restarts} at {note.next_try_at}, "
        f"after {note.last_error}"
    )
    return RunState(Phase.RESTARTING, summary, term.owner, stopped=record)


def _gone(term: LeaseTerm, now: float, why: str) -> RunState:
    """The owner's application is gone without a record."""
    return RunState(
        Phase.FAILED,
        f"failed: crash: {why} (lease {term.describe(now)})",
        term.owner,
        reason=StopReason.CRASH,
    )


def assess_run(
    term: LeaseTerm | None,
    status: FlowStatus,
    health: Health | None,
    *,
    application_gone: bool,
    now: float | None = None,
) -> RunState:
    """The state from the flow's files (see the module doc): ``health`` is the heartbeat's
    verdict for ``term``'s owner; ``application_gone``: that owner's application process is known
    gone."""
    now = time.time() if now is None else now
    if term is None:
        if status.last_batch is not None:  # its lease terms were removed (an earlier version)
            return RunState(Phase.STOPPED, "stopped: how its last run ended is not recorded")
        return RunState(Phase.NEVER_RUN, "never run")
    mine = status.owner == term.owner
    record = status.stopped if mine else None
    note = status.supervision if mine else None
    if note is not None and _note_applies(note, term, now):
        return _supervised(term, note, record)
    if record is not None:
        return _ended(term, record)
    if term.released or term.expires_at <= now:
        return _gone(term, now, NO_RECORD)
    if application_gone or health is None:
        return _gone(term, now, "its application is not running")
    if health.state == "stopped":  # its queries stopped; its record follows once Spark is down
        return RunState(Phase.STOPPING, f"stopping ({term.owner})", term.owner)
    lag = dict(health.lag) or None
    summary = f"running ({term.owner}): {health.state}: {health.reason}"
    return RunState(Phase.RUNNING, summary, term.owner, health, lag=lag)


def flow_run_state(spec: FlowSpec, settings: Settings, *, now: float | None = None) -> RunState:
    """The flow's state now, from its files (:func:`assess_run`). The application's process is
    known gone when its heartbeat names a process of this host that no longer exists, or (no
    heartbeat of this run yet) the lease owner's process is gone."""
    locations = FlowState.of(spec, settings)
    term = locations.lease_store().latest()
    status = read_status(spec, settings)
    if term is None:
        return assess_run(None, status, None, application_gone=False, now=now)
    doc = read_health(locations.health_file, term.owner)
    health = assess(doc, duration_seconds(spec.trigger.stale_after), term.acquired_at, now)
    if doc is not None:
        gone = process_gone(doc.get("host"), doc.get("pid"))
    else:
        gone = owner_process_gone(term)
    return assess_run(term, status, health, application_gone=gone, now=now)

"""A flow's ``_status.json``: its last committed batch, how its last run ended and, when that run
failed under ``conflux run``'s supervisor, what the supervisor does next. Written by the runner's
reporter (:mod:`pipelines.reporting`) and the supervisor (:mod:`pipelines.supervisor`), read by
the flow's state (:mod:`pipelines.run_state`). Imports nothing of Spark or Dagster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pipelines.catalog.state import FlowState, write_json_atomically
from pipelines.errors import ConfigError
from pipelines.messages import (
    BatchCommitted,
    FlowStopped,
    JsonObject,
    MessageError,
    _Fields,
    _strict_int,
)
from pipelines.settings import Settings
from pipelines.spec import FlowSpec


class Supervision(StrEnum):
    """What a supervisor does before a failed run, or a query of a running one
    (:mod:`pipelines.outages`), starts again."""

    RESTARTING = "restarting"
    WAITING_FOR_SOURCE = "waiting_for_source"


@dataclass(frozen=True)
class SupervisorNote:
    """The supervisor's plan after the run of the status file's owner failed: restart ``attempt``
    of ``max_restarts`` at ``next_try_at``, or wait for the source (since ``since``, until
    ``give_up_at``), and who supervises (``host`` / ``pid``: gone, the plan is void)."""

    state: Supervision
    attempt: int
    max_restarts: int
    since: str
    next_try_at: str
    give_up_at: str
    last_error: str
    host: str
    pid: int
    #: The query that waits inside its running application (:mod:`pipelines.outages`); None:
    #: the whole application is down and a supervisor outside it starts it again.
    query: str | None = None

    def to_json(self) -> JsonObject:
        data = {**self.__dict__, "state": self.state.value}
        if self.query is None:
            del data["query"]  # written only when set: older readers read the file unchanged
        return data

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> SupervisorNote:
        read = _Fields(data, "a supervisor note")
        return cls(
            state=read.required("state", Supervision),
            attempt=read.required("attempt", _strict_int),
            max_restarts=read.required("max_restarts", _strict_int),
            since=read.required("since", str),
            next_try_at=read.required("next_try_at", str),
            give_up_at=read.required("give_up_at", str),
            last_error=read.get("last_error", str, ""),
            host=read.required("host", str),
            pid=read.required("pid", _strict_int),
            query=read.optional("query", str),
        )


@dataclass(frozen=True)
class FlowStatus:
    """A flow's ``_status.json``: the owner whose run wrote it, its last committed batch, how
    that run ended (None while it runs, or when it never reported an end: a killed process) and,
    when it failed under a supervisor, what the supervisor does next.

    ``stopped`` and ``supervision`` are written only when set, so a file without them reads and
    writes back unchanged.
    """

    owner: str | None = None
    last_batch: BatchCommitted | None = None
    stopped: FlowStopped | None = None
    supervision: SupervisorNote | None = None

    def to_json(self) -> JsonObject:
        data: JsonObject = {
            "owner": self.owner,
            "last_batch": None if self.last_batch is None else self.last_batch.to_json(),
        }
        if self.stopped is not None:
            data["stopped"] = self.stopped.to_json()
        if self.supervision is not None:
            data["supervision"] = self.supervision.to_json()
        return data

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> FlowStatus:
        read = _Fields(data, "_status.json")
        last = read.object("last_batch")
        note = read.object("supervision")
        return cls(
            owner=read.optional("owner", str),
            last_batch=None if not last else BatchCommitted.parse(last),
            stopped=_stop_record(read.object("stopped")),
            supervision=_note(note),
        )


def _note(data: Mapping[str, Any] | None) -> SupervisorNote | None:
    """A status file's supervisor note; one this version cannot read (a state a later version
    added) reads as none: the flow shows as its record says."""
    if not data:
        return None
    try:
        return SupervisorNote.parse(data)
    except MessageError:
        return None


def _stop_record(data: Mapping[str, Any] | None) -> FlowStopped | None:
    """A status file's stop record; one this version cannot read (a reason a later version
    added) reads as none, so the flow still shows, as a run that recorded no end."""
    if not data:
        return None
    try:
        return FlowStopped.parse(data)
    except MessageError:
        return None


def read_status(spec: FlowSpec, settings: Settings) -> FlowStatus:
    """The flow's ``_status.json`` (empty before its first batch); one an earlier version of
    Conflux wrote reads too.

    Raises:
        ConfigError: a file this version cannot read, with the fix (it is rewritten by the flow's
            next batch).
    """
    path = FlowState.of(spec, settings).status_file
    if not path.exists():
        return FlowStatus()
    try:
        return FlowStatus.parse(json.loads(path.read_text()))
    except (json.JSONDecodeError, MessageError) as exc:
        raise ConfigError(
            f"{path}: not a status file this version reads ({exc}); delete it: the flow's next "
            "batch writes it again"
        ) from exc


def write_status(
    spec: FlowSpec, settings: Settings, owner: str, change: Callable[[FlowStatus], FlowStatus]
) -> None:
    """Rewrite the flow's status file as ``owner``'s run left it (a run killed before it wrote
    one: its owner's, with the last batch kept), changed."""
    status = read_status(spec, settings)
    if status.owner != owner:
        status = FlowStatus(owner, status.last_batch)
    write_json_atomically(FlowState.of(spec, settings).status_file, change(status).to_json())

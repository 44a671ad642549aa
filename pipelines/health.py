"""Stream health: a running flow's heartbeat file, and the rule that reads it.

The Spark application writes each flow's heartbeat (:attr:`FlowState.health_file`) on every
event Spark posts for its queries: a committed batch, a trigger that found nothing, the idle
event Spark posts every ``spark.sql.streaming.noDataProgressEventInterval`` (10 s) while a query
waits, and its start. A query stuck in a trigger (its source unreachable, a hung task) posts
nothing, so its heartbeat ages. :func:`assess` says whether a flow is healthy from that file
alone, so the Dagster sensor, the asset check and ``conflux status`` agree:

- **stale**: nothing heard for ``stale_after`` (the application is gone or stuck);
- **stalled**: a query is behind its source (lag > 0) yet committed nothing for ``stale_after``;
- otherwise **healthy**, an idle query (lag 0, idle heartbeats) included.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.catalog.state import FlowState, write_json_atomically
from pipelines.lease import process_gone
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, duration_seconds

#: Write a flow's heartbeat file at most this often (events of several queries come together).
MIN_WRITE_SECONDS = 1.0


#: ``index`` of a Delta source offset once a version is read to its end (Delta's END_INDEX).
DELTA_END_INDEX = 2**63 - 1


def delta_lag(end: Any, table_version: int | None) -> int | None:
    """Versions of the source Delta table a query has not fully read: from its batch's end
    offset to the table's latest version. The end offset's ``reservoirVersion`` is read to its
    end only when ``index`` is Delta's END_INDEX; -1 (not started) or a file index (part of it)
    leave it to read. Delta sources report no latest offset to Spark, so the caller reads it."""
    if not isinstance(end, dict) or "reservoirVersion" not in end or table_version is None:
        return None
    read_to_end = int(end.get("index", -1)) == DELTA_END_INDEX
    done = int(end["reservoirVersion"]) - (0 if read_to_end else 1)
    return max(0, table_version - done)


@dataclass
class HeartbeatWriter:
    """Keeps each flow's heartbeat file: per query its last event, last commit and lag."""

    files: Mapping[str, Location]
    owner: str = ""
    _state: dict[str, dict[str, Any]] = field(default_factory=dict)
    _written: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def beat(
        self,
        flow: str,
        query: str,
        *,
        committed_batch: int | None = None,
        lag: int | None = None,
        lag_unit: str | None = None,
        event: str = "progress",
    ) -> None:
        """A query of ``flow`` posted an event (``committed_batch``: it committed that batch)."""
        path = self.files.get(flow)
        if path is None:
            return
        now = time.time()
        with self._lock:
            doc = self._state.setdefault(
                flow,
                {
                    "flow": flow,
                    "owner": self.owner,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "started_at": now,
                    "queries": {},
                },
            )
            entry = doc["queries"].setdefault(query, {"started_at": now, "last_commit_at": None})
            entry["last_event_at"] = now
            entry["last_event"] = event
            if committed_batch is not None:
                entry["last_commit_at"] = now
                entry["last_batch_id"] = committed_batch
            if lag is not None:
                entry["lag"] = lag
                entry["lag_unit"] = lag_unit
            doc["heartbeat_at"] = now
            doc["stopped_at"] = None
            due = now - self._written.get(flow, 0.0) >= MIN_WRITE_SECONDS
            if due or committed_batch is not None:
                self._written[flow] = now
                write_json_atomically(path, doc)

    def stopped(self) -> None:
        """The application stops its queries: say so, so a stopped flow is not read as stuck."""
        now = time.time()
        with self._lock:
            for flow, doc in self._state.items():
                doc["stopped_at"] = now
                write_json_atomically(self.files[flow], doc)


@dataclass(frozen=True)
class Health:
    """What :func:`assess` found: ``state`` is healthy, starting, stale, stalled or stopped."""

    state: str
    reason: str
    heartbeat_age_seconds: float | None = None
    lag: dict[str, int] = field(default_factory=dict)
    seconds_since_commit: dict[str, float] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.state in ("healthy", "starting")

    def metadata(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "heartbeat_age_seconds": self.heartbeat_age_seconds,
            "lag": dict(self.lag),
            "seconds_since_commit": dict(self.seconds_since_commit),
        }


def read_health(path: Location, owner: str) -> dict[str, Any] | None:
    """The heartbeat file written by lease owner ``owner``'s application (None: none yet; a
    file left by an earlier run is not this run's heartbeat)."""
    try:
        doc = dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return doc if doc.get("owner") == owner else None


def assess(
    doc: Mapping[str, Any] | None, stale_after: float, since: float, now: float | None = None
) -> Health:
    """The health of a flow running since ``since`` (its lease's start) from its heartbeat file
    of this run (see the module doc); a flow starting up has ``stale_after`` to send the first."""
    now = time.time() if now is None else now
    if doc is None:
        waited = now - since
        if waited <= stale_after:
            return Health("starting", f"started {waited:.0f} s ago, no heartbeat yet")
        return Health(
            "stale",
            f"no heartbeat in the {waited:.0f} s since the flow started (limit "
            f"{stale_after:.0f} s): its Spark application did not start its queries",
            round(waited, 1),
        )
    if doc.get("stopped_at"):
        return Health("stopped", "the application stopped its queries")
    queries: Mapping[str, Mapping[str, Any]] = doc.get("queries") or {}
    # Each query's last event: one stuck query is not hidden by the others' heartbeats.
    heard = {
        q: float(e.get("last_event_at") or e.get("started_at") or 0.0) for q, e in queries.items()
    }
    if not heard:
        heard = {"the application": float(doc.get("heartbeat_at") or 0.0)}
    quietest = min(heard, key=heard.__getitem__)
    age = now - heard[quietest]
    lag = {q: int(e["lag"]) for q, e in queries.items() if e.get("lag") is not None}
    units = {q: str(e.get("lag_unit") or "records") for q, e in queries.items()}
    since_commit = {
        q: round(now - float(e.get("last_commit_at") or e.get("started_at") or now), 1)
        for q, e in queries.items()
    }

    def found(state: str, reason: str) -> Health:
        return Health(state, reason, round(age, 1), lag, since_commit)

    if age > stale_after:
        gone = process_gone(doc.get("host"), doc.get("pid"))
        return found(
            "stale",
            f"nothing heard from {quietest} for {age:.0f} s (limit {stale_after:.0f} s): "
            + (
                "its Spark application is gone"
                if gone
                else "it is stuck in a trigger (is its source reachable?) or in a batch longer "
                "than stale_after"
            ),
        )
    stalled = [q for q, n in lag.items() if n > 0 and since_commit.get(q, 0.0) > stale_after]
    if stalled:
        return found(
            "stalled",
            ", ".join(f"{q} is {lag[q]} {units[q]} behind" for q in stalled)
            + f" with no commit for more than {stale_after:.0f} s",
        )
    behind = [f"{q} {n} {units[q]}" for q, n in lag.items() if n > 0]
    unknown = [q for q in queries if q not in lag]
    return found(
        "healthy",
        f"every query heard within {age:.0f} s; "
        + (f"lag: {', '.join(behind)}" if behind else "no known lag")
        + (f" (lag unknown for {', '.join(unknown)})" if unknown else ""),
    )


def flow_health(spec: FlowSpec, settings: Settings) -> Health | None:
    """A flow's health now, or None when it is not running (no lease, or a released one): what
    the Dagster sensor records and ``conflux status`` prints."""
    locations = FlowState.of(spec, settings)
    term = locations.lease_store().latest()
    if term is None or term.released:
        return None
    doc = read_health(locations.health_file, term.owner)
    return assess(doc, duration_seconds(spec.trigger.stale_after), since=term.acquired_at)

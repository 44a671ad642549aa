"""How a run is asked to stop, and how a query stops without losing its in-flight batch.

A stop request comes from a signal (SIGTERM / SIGINT), from :meth:`StopRequest.request`, or from a
stop file appearing: the ``--stop-file`` of a launcher, or a flow's stop channel
(:meth:`pipelines.catalog.state.FlowState.stop_file`), which also reaches a driver on a cluster
where signals do not. The runner then stops each query once its in-flight micro-batch committed.
:func:`ask_to_stop` writes who asks into the stop file, so the flow's state can say who stopped it.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from pipelines.location import Location
from pipelines.timestamps import iso_utc

#: How often a stop file on an object store is looked for (a request each time; local ones are
#: looked for at every check).
REMOTE_STOP_POLL_SECONDS = 2.0


def requester(what: str) -> str:
    """``what`` (a command, a launcher) with the user, host and process asking: who stopped it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return f"{what} (user {user} on {socket.gethostname()}, pid {os.getpid()})"


def ask_to_stop(stop_file: Location, by: str) -> None:
    """Create ``stop_file``, naming who asks (:func:`requester`) and when: the runner records it
    as the stop's reason, which the flow's state shows."""
    stop_file.write_text(json.dumps({"by": by, "at": iso_utc()}))


def stop_requested_by(stop_file: Location) -> str:
    """Who :func:`ask_to_stop` says asked; an empty or unreadable file (an earlier version's, a
    user's ``touch``) names the file instead."""
    try:
        by = json.loads(stop_file.read_text()).get("by")
    except (OSError, ValueError, AttributeError):
        by = None
    return str(by) if by else f"stop file {stop_file}"


class StopRequest:
    """Set by SIGTERM / SIGINT, by :meth:`request`, or by one of the stop files appearing."""

    def __init__(self, stop_file: Location | None, *more_stop_files: Location) -> None:
        self._event = threading.Event()
        self._stop_files = [f for f in (stop_file, *more_stop_files) if f is not None]
        self._remote_checked_at = 0.0
        self.reason = ""

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.request(signal.Signals(signum).name)

    def watch(self, stop_file: Location) -> None:
        self._stop_files.append(stop_file)

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self._event.set()

    @property
    def requested(self) -> bool:
        if not self._event.is_set():
            now = time.monotonic()
            remote_due = now - self._remote_checked_at >= REMOTE_STOP_POLL_SECONDS
            if remote_due:
                self._remote_checked_at = now
            for stop_file in self._stop_files:
                if (stop_file.is_local or remote_due) and self._appeared(stop_file):
                    self.request(stop_requested_by(stop_file))
                    break
        return self._event.is_set()

    @staticmethod
    def _appeared(stop_file: Location) -> bool:
        try:
            return stop_file.exists()
        except OSError:  # the store failed one request: look again next time
            return False


def last_batch_id(query: StreamingQuery) -> int:
    """The id of the last micro-batch ``query`` ran in this run, -1 before its first.

    Not ``lastProgress["batchId"]`` as such: a trigger that finds no data records a progress under
    the id of the *next* batch, with no ``addBatch`` among its durations (the first such trigger
    after a start at once, then every ``spark.sql.streaming.noDataProgressEventInterval``), and
    listeners hear no progress of it. Waiting for that batch would wait for one that never runs;
    nor does ``batchId - 1`` do for a query restarted from a checkpoint that has run nothing yet.
    The newest progress that ran a batch is taken from this run's recent progress.
    """
    progress = query.lastProgress
    if progress is not None and _ran(progress):
        return int(progress["batchId"])
    for recent in reversed(query.recentProgress or []):
        if _ran(recent):
            return int(recent["batchId"])
    return -1


def _ran(progress: Any) -> bool:
    return "addBatch" in (progress.get("durationMs") or {})


def batch_may_commit(query: StreamingQuery) -> bool:
    """True while the trigger running now may still commit a micro-batch: it is active and has not
    settled on waiting (Spark's status reads "Waiting for data to arrive" once a trigger found no
    new data, and "Waiting for next trigger" between triggers)."""
    status = query.status
    return bool(status.get("isTriggerActive")) and not str(status.get("message", "")).startswith(
        "Waiting"
    )


def stop_after_inflight_batches(queries: Iterable[StreamingQuery], timeout: float = 120.0) -> None:
    """Stop ``queries`` once the micro-batches running now have committed, under one deadline.

    Each query's batch in flight is noted before any wait, so a batch a downstream query starts on
    an upstream commit made during the wait is not waited for. A trigger that is only looking for
    new data and finds none ends its query's wait at once: a stop never waits for a batch that
    will not run. A batch a query starts after its wait is interrupted, uncommitted, and replayed
    on restart.
    """
    inflight = [(query, last_batch_id(query) + 1) for query in queries]
    deadline = time.monotonic() + timeout
    for query, batch in inflight:
        while (
            query.isActive
            and last_batch_id(query) < batch
            and batch_may_commit(query)
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    for query, _batch in inflight:
        query.stop()

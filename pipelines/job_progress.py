"""Progress of the Spark jobs a batch operation (a backfill) runs, for a person watching it.

A backfill of a date range is one Spark application running a handful of jobs (read, join or
aggregate, ``replaceWhere`` write); its progress is the share of the tasks done among those
of the jobs planned so far (Spark plans a job only when the previous one needs it, so the total
grows as the backfill goes). Spark's status tracker gives them without a listener; :class:`JobProgress`
polls it on a thread and hands a line to ``show``: a progress bar redrawn in place on a
terminal (``conflux backfill``), a log line every few seconds elsewhere (the Dagster asset).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from pyspark.sql import SparkSession

BAR_WIDTH = 30


@dataclass(frozen=True)
class TaskCounts:
    stages: int
    tasks: int
    done: int

    def bar(self, label: str, elapsed: float) -> str:
        share = self.done / self.tasks if self.tasks else 0.0
        filled = round(share * BAR_WIDTH)
        return (
            f"{label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.tasks} "
            f"tasks of {self.stages} stage(s), {elapsed:.0f} s"
        )


def task_counts(tracker: Any, seen: dict[int, tuple[int, int]], first_job: int = 0) -> TaskCounts:
    """Tasks of every stage of the jobs since ``first_job`` (``seen`` keeps them; a stage no
    longer active is done: finished, or skipped because an earlier job computed it)."""
    active = set(tracker.getActiveStageIds())
    stages = set(active)
    for job_id in tracker.getJobIdsForGroup():
        info = tracker.getJobInfo(job_id) if job_id >= first_job else None
        stages.update(info.stageIds if info is not None else ())
    for stage_id in stages:
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            total = int(info.numTasks)
            seen[stage_id] = (total, int(info.numCompletedTasks) if stage_id in active else total)
    for stage_id in set(seen) - active:
        seen[stage_id] = (seen[stage_id][0], seen[stage_id][0])
    return TaskCounts(
        stages=len(seen),
        tasks=sum(total for total, _ in seen.values()),
        done=sum(done for _, done in seen.values()),
    )


class JobProgress:
    """Shows the progress of the Spark work run inside the ``with`` block every ``every``
    seconds (and once at the end)."""

    def __init__(
        self, spark: SparkSession, label: str, show: Callable[[str], None], every: float = 1.0
    ) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._label, self._show, self._every = label, show, every
        self._seen: dict[int, tuple[int, int]] = {}
        self._first_job = max(self._tracker.getJobIdsForGroup(), default=-1) + 1
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="job-progress", daemon=True)

    def _line(self) -> str:
        counts = task_counts(self._tracker, self._seen, self._first_job)
        return counts.bar(self._label, time.monotonic() - self._started)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._show(self._line())

    def __enter__(self) -> JobProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._show(self._line())


#: Seconds between progress lines: redrawn each second on a terminal; elsewhere (a log file, a
#: CI job) a line each this many seconds, so the output stays readable.
TERMINAL_EVERY, LOG_EVERY = 1.0, 10.0


def progress_every(stream: TextIO = sys.stderr) -> float:
    """How often :class:`JobProgress` shows a line on ``stream``."""
    return TERMINAL_EVERY if stream.isatty() else LOG_EVERY


def _say(line: str) -> None:
    print(line, flush=True)


@contextmanager
def ticking(every: float, show: Callable[[str], None] = _say) -> Iterator[None]:
    """A line saying how long it has been, every ``every`` seconds while the block runs: a long
    wait that shows it is alive (a build, a Spark job whose own output goes to a log)."""
    started, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(every):
            show(f"  ... {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=tick, name="ticking", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def terminal_bar(stream: TextIO = sys.stderr) -> Callable[[str], None]:
    """Redraws one line in place on a terminal; prints plain lines when not a terminal (show
    them every :func:`progress_every`)."""
    if not stream.isatty():
        return lambda line: print(line, file=stream, flush=True)

    def show(line: str) -> None:
        stream.write("\r\033[K" + line)
        stream.flush()

    return show

"""Where a Spark application's time went, from its event log (``--event-log`` only).

Off by default, since writing the log costs a little. Gives the summed ``durationMs`` phases of
the streaming query's data batches, task run time against task CPU time (the gap is time spent
waiting: for Kafka, for disk, or for a CPU on a busy machine), and the application's timeline.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

PHASES = ("latestOffset", "queryPlanning", "getBatch", "walCommit", "addBatch", "commitOffsets")
PROGRESS = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
STARTED = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryStartedEvent"


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark settings that write an uncompressed event log into ``folder`` (created here)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(folder),
        "spark.eventLog.compress": "false",
    }


def read_events(folder: Path) -> Iterator[dict[str, Any]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "events" in p.name)
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def _rows(progress: dict[str, Any]) -> int:
    return sum(int(source.get("numInputRows", 0)) for source in progress.get("sources", []))


def breakdown(folder: Path) -> dict[str, float]:
    """Seconds per query phase (data batches only), task run/CPU time, and the timeline."""
    seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
    seconds.update(task_run=0.0, task_cpu=0.0)
    times: dict[str, float] = {}
    for event in read_events(folder):
        kind = event["Event"]
        if kind == PROGRESS and _rows(event["progress"]):
            for phase in PHASES:
                seconds[phase] += event["progress"]["durationMs"].get(phase, 0) / 1000
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            seconds["task_run"] += metrics.get("Executor Run Time", 0) / 1000
            seconds["task_cpu"] += metrics.get("Executor CPU Time", 0) / 1e9
        _timeline(event, times)
    seconds.update(_spans(times))
    return {key: round(value, 2) for key, value in seconds.items()}


def _timeline(event: dict[str, Any], times: dict[str, float]) -> None:
    kind = event["Event"]
    if kind == "SparkListenerApplicationStart":
        times["app_start"] = event["Timestamp"] / 1000
    elif kind == "SparkListenerApplicationEnd":
        times["app_end"] = event["Timestamp"] / 1000
    elif kind == STARTED:
        times.setdefault("query_start", _epoch(event["timestamp"]))
    elif kind == PROGRESS:
        progress = event["progress"]
        end = _epoch(progress["timestamp"]) + progress["batchDuration"] / 1000
        times["last_batch_end"] = max(end, times.get("last_batch_end", 0.0))


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _spans(times: dict[str, float]) -> dict[str, float]:
    """App start → query start → end of the last batch → app end, where known."""
    spans = {}
    order = ("app_start", "query_start", "last_batch_end", "app_end")
    for first, second in itertools.pairwise(order):
        if first in times and second in times:
            spans[f"{first}_to_{second}"] = times[second] - times[first]
    return spans

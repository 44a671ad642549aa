"""Which executors ran an application: read from the driver's own status API before it stops.

On a cluster an operator wants to know where a flow's work went (and that it went to the
cluster at all, not to the driver). Spark's monitoring API on the driver's UI lists every
executor the application had, live or lost, with the tasks each completed and failed.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession


@dataclass(frozen=True)
class ExecutorWork:
    """One executor of the application and the tasks it ran."""

    executor_id: str
    host_port: str
    completed_tasks: int
    failed_tasks: int
    active: bool

    def describe(self) -> str:
        lost = "" if self.active else ", lost"
        failed = f", {self.failed_tasks} failed" if self.failed_tasks else ""
        return f"executor {self.executor_id} at {self.host_port}: {self.completed_tasks} tasks{failed}{lost}"


def executors_of(spark: SparkSession, timeout: float = 5.0) -> list[ExecutorWork]:
    """Every executor the application has had (the driver excluded); empty without a UI."""
    context = spark.sparkContext
    if not context.uiWebUrl:
        return []
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/allexecutors"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            listed: list[dict[str, Any]] = json.loads(reply.read())
    except (OSError, ValueError):
        return []
    return [
        ExecutorWork(
            str(item["id"]),
            str(item.get("hostPort", "?")),
            int(item.get("completedTasks", 0)),
            int(item.get("failedTasks", 0)),
            bool(item.get("isActive", False)),
        )
        for item in listed
        if item.get("id") != "driver"
    ]


def executors_report(spark: SparkSession) -> str | None:
    """One line naming the application and every executor's work; None in local mode."""
    if (spark.sparkContext.master or "local").startswith("local"):
        return None
    executors = executors_of(spark)
    listed = "; ".join(e.describe() for e in executors) or "none reported (no Spark UI)"
    return (
        f"application {spark.sparkContext.applicationId} on {spark.sparkContext.master}: {listed}"
    )

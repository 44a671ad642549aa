"""Which executors ran an application: read from the driver's status store before it stops.

On a cluster an operator wants to know where a flow's work went (and that it went to the
cluster at all, not to the driver). The driver's status store (what its UI and monitoring API
show) lists every executor the application had, live or lost, with the tasks each completed and
failed.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def executors_of(spark: SparkSession) -> list[ExecutorWork]:
    """Every executor the application has had (the driver excluded), from the driver's own
    status store: no HTTP round trip to its UI, which a loaded host may answer too late."""
    jvm_context = spark.sparkContext._jsc.sc()
    listed = jvm_context.statusStore().executorList(False)  # live and lost ones
    found = []
    for index in range(listed.size()):
        item = listed.apply(index)
        if item.id() == "driver":
            continue
        found.append(
            ExecutorWork(
                str(item.id()),
                str(item.hostPort()),
                int(item.completedTasks()),
                int(item.failedTasks()),
                bool(item.isActive()),
            )
        )
    return found


def executors_report(spark: SparkSession) -> str | None:
    """One line naming the application and every executor's work; None in local mode, and None
    when the driver cannot say: it is called in the runner's ``finally``, before the session
    stops, possibly after a failure, and must never hide that failure or skip the stop."""
    try:
        context = spark.sparkContext
        if (context.master or "local").startswith("local"):
            return None
        listed = "; ".join(e.describe() for e in executors_of(spark)) or "no executor registered"
        return f"application {context.applicationId} on {context.master}: {listed}"
    except Exception:  # a dead driver JVM or a closed py4j gateway: no report, the error stands
        return None

"""Per-micro-batch progress of running flows, taken from Spark's StreamingQueryListener.

For every committed micro-batch a :class:`BatchProgress` records input rows, rates, the batch
duration, the source's offsets against the latest available ones (lag) and the Delta table version
the batch wrote. :class:`ProgressTracker` also keeps per-flow totals for the run's summary.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from delta.tables import DeltaTable
from py4j.protocol import Py4JError
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener


@dataclass(frozen=True)
class BatchProgress:
    flow: str
    batch_id: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    end_offsets: Any
    latest_offsets: Any
    lag: int | None
    delta_version: int | None
    timestamp: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FlowTotals:
    flow: str
    table_path: str
    rows_written: int = 0
    batches: int = 0
    last_batch_id: int = -1
    delta_version: int | None = None
    end_offsets: Any = None
    lag: int | None = None
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        return {
            "flow": self.flow,
            "table_path": self.table_path,
            "rows_written": self.rows_written,
            "batches": self.batches,
            "delta_version": self.delta_version,
            "end_offsets": self.end_offsets,
            "lag": self.lag,
            "duration_seconds": round(time.monotonic() - self.started, 3),
        }


class ProgressSink(Protocol):
    def batch(self, progress: BatchProgress) -> None: ...


def _parse_offsets(raw: str | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def kafka_lag(end: Any, latest: Any) -> int | None:
    """Records between the batch's end offsets and the latest available, over all partitions."""
    if not isinstance(end, dict) or not isinstance(latest, dict):
        return None
    lag = 0
    for topic, partitions in latest.items():
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            lag += max(0, int(offset) - int(end.get(topic, {}).get(partition, 0)))
    return lag


def delta_version(spark: SparkSession, table_path: str) -> int | None:
    """The table's latest committed version, or None before its first commit.

    Reads the snapshot the Delta sink just committed from Delta's in-memory log cache, which runs
    no Spark job; ``DESCRIBE HISTORY`` (a job on the cores the next micro-batch needs) is the
    fallback if that internal API is unavailable.
    """
    try:
        jvm: Any = spark.sparkContext._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table_path)
        version = int(log.unsafeVolatileSnapshot().version())
        return version if version >= 0 else None
    except Py4JError:
        if not DeltaTable.isDeltaTable(spark, table_path):
            return None
        return int(DeltaTable.forPath(spark, table_path).history(1).collect()[0]["version"])


class ProgressTracker(StreamingQueryListener):
    """Turns Spark's progress events into :class:`BatchProgress` for ``sink``, keeping totals."""

    def __init__(
        self, spark: SparkSession, table_paths: dict[str, str], sink: ProgressSink
    ) -> None:
        self._spark = spark
        self._sink = sink
        self._lock = threading.Lock()
        self.totals = {flow: FlowTotals(flow, path) for flow, path in table_paths.items()}

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's listener API
        pass

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        totals = self.totals.get(progress.name)
        if totals is None:
            return
        batch = self._batch_progress(progress, totals.table_path)
        with self._lock:
            totals.last_batch_id = max(totals.last_batch_id, batch.batch_id)
            totals.lag = batch.lag
            if batch.input_rows == 0:  # an idle trigger: nothing was written
                return
            totals.rows_written += batch.input_rows
            totals.batches += 1
            totals.delta_version = batch.delta_version
            totals.end_offsets = batch.end_offsets
        self._sink.batch(batch)

    def _batch_progress(self, progress: Any, table_path: str) -> BatchProgress:
        sources = progress.sources or []
        end = _parse_offsets(sources[0].endOffset) if sources else None
        latest = _parse_offsets(sources[0].latestOffset) if sources else None
        return BatchProgress(
            flow=progress.name,
            batch_id=int(progress.batchId),
            input_rows=int(progress.numInputRows),
            input_rows_per_second=round(float(progress.inputRowsPerSecond or 0.0), 1),
            processed_rows_per_second=round(float(progress.processedRowsPerSecond or 0.0), 1),
            batch_duration_ms=int(progress.batchDuration),
            end_offsets=end,
            latest_offsets=latest,
            lag=kafka_lag(end, latest),
            delta_version=delta_version(self._spark, table_path) if progress.numInputRows else None,
            timestamp=str(progress.timestamp),
        )

    def wait_for_batch(self, flow: str, batch_id: int, timeout: float = 15.0) -> None:
        """Block until the listener has seen ``batch_id`` of ``flow`` (events arrive async)."""
        deadline = time.monotonic() + timeout
        while self.totals[flow].last_batch_id < batch_id and time.monotonic() < deadline:
            time.sleep(0.05)

"""Per-micro-batch progress of running flows, taken from Spark's StreamingQueryListener.

For every committed micro-batch a :class:`pipelines.messages.BatchCommitted` records input rows,
rates, the batch duration, the source's offsets against the latest available ones (lag, in total
and per partition), and what the batch's Delta writes really did: every table it wrote, the
version and the rows each write added, or that the batch was a replay Delta skipped (reported by
the stages through :meth:`ProgressTracker.record_commit`). :class:`ProgressTracker` also keeps
per-flow totals for the run's summary; ``rows_written`` counts rows Delta added, never replayed
input. :class:`BatchFailures` keeps the exception that failed a query's batch, which Spark hands
back to the runner only as text.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from delta.tables import DeltaTable
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from pipelines.catalog.roles import BRONZE_STAGE
from pipelines.health import HeartbeatWriter, delta_lag
from pipelines.messages import BatchCommitted, Quality, TableWrite

#: The name the integration tests and benchmarks know the batch message by.
BatchProgress = BatchCommitted


@dataclass
class FlowTotals:
    """Totals of one stage's query of a flow over a run."""

    flow: str
    table_path: str
    stage: str = BRONZE_STAGE
    #: Per table the stage wrote: role -> {table, rows, version}.
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows_written: int = 0
    batches: int = 0
    replayed_batches: int = 0
    last_batch_id: int = -1
    delta_version: int | None = None
    end_offsets: Any = None
    lag: int | None = None
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        return {
            "flow": self.flow,
            "stage": self.stage,
            "tables": self.tables,
            "table_path": self.table_path,
            "rows_written": self.rows_written,
            "batches": self.batches,
            "replayed_batches": self.replayed_batches,
            "delta_version": self.delta_version,
            "end_offsets": self.end_offsets,
            "lag": self.lag,
            "duration_seconds": round(time.monotonic() - self.started, 3),
        }


@dataclass(frozen=True)
class BatchCommit:
    """What one micro-batch's Delta writes really did (reported by the stage that wrote them).

    ``table_version`` and ``rows_added`` are those of the stage's main table (bronze: its table;
    silver: the current-state table's version and the events appended); ``writes`` has every
    table the batch wrote (history, deleted keys, late rows included); ``quality`` the batch's
    check results (silver: where its rows went and what its expectations found; a gold split:
    on time, late, quarantined).
    """

    flow: str
    batch_id: int
    table_version: int | None
    rows_added: int
    replayed: bool
    stage: str = BRONZE_STAGE
    writes: tuple[TableWrite, ...] = ()
    quality: Quality | None = None

    @property
    def query_name(self) -> str:
        return query_name(self.flow, self.stage)


def query_name(flow: str, stage: str) -> str:
    """The streaming query of a flow's stage: ``<flow>`` for bronze, ``<flow>.<stage>`` after it."""
    return flow if stage == BRONZE_STAGE else f"{flow}.{stage}"


def flow_of_query(query: str) -> str:
    """The flow whose stage runs ``query`` (:func:`query_name`; a flow's name has no dot)."""
    return query.split(".", 1)[0]


#: Of a state operator's custom metrics, those a user reads (RocksDB's size on disk and commit
#: latencies, deduplication's dropped rows); the rest are RocksDB internals.
STATE_METRICS = (
    "rocksdbSstFileSize",
    "rocksdbTotalBytesWritten",
    "rocksdbCommitFileSyncLatencyMs",
    "rocksdbLoadLatencyMs",
    "numDroppedDuplicateRows",
)


def state_of(progress: Any) -> dict[str, Any] | None:
    """The state of a stateful query's batch, from Spark's progress (None for stateless ones)."""
    operators = list(progress.stateOperators or [])
    if not operators:
        return None
    return {
        "watermark": (progress.eventTime or {}).get("watermark"),
        "rows_total": sum(int(o.numRowsTotal) for o in operators),
        "memory_bytes": sum(int(o.memoryUsedBytes) for o in operators),
        "commit_ms": sum(int(o.commitTimeMs) for o in operators),
        "rows_dropped_by_watermark": sum(int(o.numRowsDroppedByWatermark) for o in operators),
        "operators": [
            {
                "operator": o.operatorName,
                "rows_total": int(o.numRowsTotal),
                "rows_updated": int(o.numRowsUpdated),
                "memory_bytes": int(o.memoryUsedBytes),
                "commit_ms": int(o.commitTimeMs),
                "rows_dropped_by_watermark": int(o.numRowsDroppedByWatermark),
                "custom": {
                    k: int(v) for k, v in (o.customMetrics or {}).items() if k in STATE_METRICS
                },
            }
            for o in operators
        ],
    }


class ProgressSink(Protocol):
    def batch(self, progress: BatchCommitted) -> None: ...


def _parse_offsets(raw: str | None) -> Any:
    # PySpark renders a missing offset as the string "None" (str() of a null Java value).
    if not raw or raw in ("None", "null"):
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def partition_lag(end: Any, latest: Any) -> dict[str, int] | None:
    """Records between the batch's end offsets and the latest available, per ``topic-partition``."""
    if not isinstance(end, dict) or not isinstance(latest, dict):
        return None
    lags: dict[str, int] = {}
    for topic, partitions in latest.items():
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            done = int(end.get(topic, {}).get(partition, 0))
            lags[f"{topic}-{partition}"] = max(0, int(offset) - done)
    return lags


def kafka_lag(end: Any, latest: Any) -> int | None:
    """Records between the batch's end offsets and the latest available, over all partitions."""
    lags = partition_lag(end, latest)
    return None if lags is None else sum(lags.values())


#: ``sources[].description`` of a Delta source: ``DeltaSource[<table path>]``.
_DELTA_SOURCE = re.compile(r"^DeltaSource\[(?P<path>.+)\]$")


def delta_version(spark: SparkSession, table_path: str, job_fallback: bool = True) -> int | None:
    """The table's latest committed version, or None before its first commit.

    Reads the snapshot the Delta sink just committed from Delta's in-memory log cache, which runs
    no Spark job; ``DESCRIBE HISTORY`` (a job on the cores the next micro-batch needs) is the
    fallback if that internal API is unavailable, unless ``job_fallback`` is off (None then).
    """
    try:
        jvm: Any = spark.sparkContext._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table_path)
        version = int(log.unsafeVolatileSnapshot().version())
        return version if version >= 0 else None
    except Py4JError:
        if not job_fallback or not DeltaTable.isDeltaTable(spark, table_path):
            return None
        return int(DeltaTable.forPath(spark, table_path).history(1).collect()[0]["version"])


#: A query's ``foreachBatch`` function: (the batch, its id).
BatchFunction = Callable[[DataFrame, int], None]


class BatchFailures:
    """The exception that failed each query's batch, kept where it was raised.

    Spark runs a query's ``foreachBatch`` function in this process, but a Python exception raised
    there reaches the runner only as the text of a ``StreamingQueryException`` (the Python
    traceback inside Py4J's message). :meth:`watch` wraps the function so that the exception
    object itself is recorded first, and the runner learns why the query stopped from its type
    (:mod:`pipelines.stops`), never from that text.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raised: dict[str, BaseException] = {}

    def watch(self, query: str, write: BatchFunction) -> BatchFunction:
        """``write``, recording the exception that fails a batch of ``query`` before Spark sees it."""

        def guarded(batch: DataFrame, batch_id: int) -> None:
            try:
                write(batch, batch_id)
            except BaseException as exc:
                self.record(query, exc)
                raise

        return guarded

    def record(self, query: str, exc: BaseException) -> None:
        with self._lock:
            self._raised.setdefault(query, exc)  # the first: what failed the query

    def forget(self, query: str) -> None:
        """``query`` starts again: what failed its last run no longer says why it fails next."""
        with self._lock:
            self._raised.pop(query, None)

    def of(self, query: str) -> BaseException | None:
        """What failed a batch of ``query`` (None: nothing raised in its ``foreachBatch``)."""
        with self._lock:
            return self._raised.get(query)


class ProgressTracker(StreamingQueryListener):
    """Turns Spark's progress events into :class:`BatchCommitted` for ``sink``, keeping totals.

    A batch's stage calls :meth:`record_commit` from ``foreachBatch``, before Spark writes the
    batch's commit-log entry; Spark posts the progress event after that entry, so the commit is
    known by the time :meth:`onQueryProgress` handles the batch.
    """

    def __init__(
        self,
        sink: ProgressSink,
        heartbeat: HeartbeatWriter | None = None,
        spark: SparkSession | None = None,
    ) -> None:
        self._sink = sink
        self._heartbeat = heartbeat
        self._spark = spark  # reads a Delta source's latest version (its lag)
        self._names: dict[str, str] = {}  # query id -> name (idle events carry only the id)
        self._lock = threading.Lock()
        self._commits: dict[tuple[str, int], list[BatchCommit]] = {}
        #: Keyed by query name (:func:`query_name`).
        self.totals: dict[str, FlowTotals] = {}
        #: What failed a query's batch (the flows' ``foreachBatch`` functions are watched).
        self.failures = BatchFailures()

    def track(
        self, flow: str, stage: str, table_path: str, tables: dict[str, tuple[str, str]]
    ) -> None:
        """Follow ``flow``'s ``stage``, whose main table is at ``table_path``; ``tables`` maps
        each role the stage writes (bronze, events, ...) to (table name, path)."""
        totals = FlowTotals(flow, table_path, stage)
        for role, (table, path) in tables.items():
            totals.tables[role] = {"table": table, "path": path, "rows": 0, "version": None}
        self.totals[query_name(flow, stage)] = totals

    def record_commit(self, commit: BatchCommit, query: str | None = None) -> None:
        """A stage wrote a batch in ``query`` (default: the stage's own query); several stages
        may write in one query's batch. A batch run again in place (:func:`pipelines.held.
        run_batch`) reports the stages that had finished again, as skipped writes; their first
        report is kept. (A stage that failed partway reports only from its last attempt, where
        the writes its earlier attempt committed show as skipped.)"""
        with self._lock:
            commits = self._commits.setdefault((query or commit.query_name, commit.batch_id), [])
            if all(c.stage != commit.stage for c in commits):
                commits.append(commit)

    def _source_lag(self, progress: Any) -> dict[str, Any]:
        """How far the query's (first) source is behind: Kafka records, or Delta versions (the
        latest version this application's Delta log knows, read without a Spark job). Never
        raises: a listener error must not cost the batch's bookkeeping."""
        try:
            sources = progress.sources or []
            if not sources:
                return {}
            end = _parse_offsets(sources[0].endOffset)
            records = kafka_lag(end, _parse_offsets(sources[0].latestOffset))
            if records is not None:
                return {"lag": records, "lag_unit": "records"}
            match = _DELTA_SOURCE.match(str(sources[0].description or ""))
            if match is None or self._spark is None:
                return {}
            latest = delta_version(self._spark, match["path"], job_fallback=False)
            versions = delta_lag(end, latest)
            return {} if versions is None else {"lag": versions, "lag_unit": "versions"}
        except Exception as exc:
            print(f"conflux: lag of {progress.name} unknown: {exc}", file=sys.stderr, flush=True)
            return {}

    def _beat(self, name: str | None, event: str, **details: Any) -> None:
        """Write the flow's heartbeat; never raises (a full disk must not stop the stream)."""
        totals = self.totals.get(name or "")
        if self._heartbeat is None or totals is None or name is None:
            return
        try:
            self._heartbeat.beat(totals.flow, name, event=event, **details)
        except Exception as exc:
            print(f"conflux: heartbeat of {name} not written: {exc}", file=sys.stderr, flush=True)

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's listener API
        self._names[str(event.id)] = event.name
        self._beat(event.name, "started")

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        self._beat(self._names.get(str(event.id)), "idle")

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        totals = self.totals.get(progress.name)
        if totals is None:
            return
        ran = "addBatch" in (progress.durationMs or {})  # an idle trigger runs no batch
        lag = self._source_lag(progress)
        try:
            self._record(progress, totals, ran, lag)
        finally:
            self._beat(progress.name, "batch" if ran else "no data", **lag,
                       committed_batch=int(progress.batchId) if ran else None)  # fmt: skip

    def _record(self, progress: Any, totals: FlowTotals, ran: bool, lag: dict[str, Any]) -> None:
        """Update the totals with the batch's commits and hand each to the sink."""
        with self._lock:
            key = (progress.name, int(progress.batchId))
            commits = self._commits.pop(key, []) if ran else []
            versions = lag.get("lag") if lag.get("lag_unit") == "versions" else None
            batches = [self._batch_progress(progress, commit, versions) for commit in commits]
            totals.last_batch_id = max(totals.last_batch_id, int(progress.batchId))
            if not commits:  # an idle trigger: no batch ran, nothing was written
                return
            for commit, batch in zip(commits, batches, strict=True):
                stage_totals = self.totals.get(commit.query_name, totals)
                stage_totals.last_batch_id = max(stage_totals.last_batch_id, batch.batch_id)
                stage_totals.lag = batch.lag
                stage_totals.rows_written += batch.rows_added
                stage_totals.batches += 1
                stage_totals.replayed_batches += int(batch.replayed)
                if batch.delta_version is not None:
                    stage_totals.delta_version = batch.delta_version
                stage_totals.end_offsets = batch.end_offsets
                for write in batch.writes:
                    table = stage_totals.tables.setdefault(
                        write.role,
                        {"table": write.table, "path": None, "rows": 0, "version": None},
                    )
                    table["rows"] += write.rows
                    if write.version is not None:
                        table["version"] = write.version
        for batch in batches:
            self._sink.batch(batch)

    @staticmethod
    def _batch_progress(
        progress: Any, commit: BatchCommit | None, lag_versions: int | None = None
    ) -> BatchCommitted:
        sources = progress.sources or []
        end = _parse_offsets(sources[0].endOffset) if sources else None
        latest = _parse_offsets(sources[0].latestOffset) if sources else None
        return BatchCommitted(
            flow=commit.flow if commit else progress.name,
            stage=commit.stage if commit else BRONZE_STAGE,
            batch_id=int(progress.batchId),
            input_rows=int(progress.numInputRows),
            rows_added=commit.rows_added if commit else 0,
            replayed=commit.replayed if commit else False,
            input_rows_per_second=round(float(progress.inputRowsPerSecond or 0.0), 1),
            processed_rows_per_second=round(float(progress.processedRowsPerSecond or 0.0), 1),
            batch_duration_ms=int(progress.batchDuration),
            end_offsets=end,
            latest_offsets=latest,
            lag=kafka_lag(end, latest),
            partition_lag=partition_lag(end, latest),
            delta_version=commit.table_version if commit else None,
            timestamp=str(progress.timestamp),
            writes=commit.writes if commit else (),
            quality=commit.quality if commit else None,
            state=state_of(progress),
            lag_versions=lag_versions,
        )

    def wait_for_batch(self, query: str, batch_id: int, timeout: float = 15.0) -> None:
        """Block until the listener has seen ``batch_id`` of ``flow`` (events arrive async)."""
        deadline = time.monotonic() + timeout
        while self.totals[query].last_batch_id < batch_id and time.monotonic() < deadline:
            time.sleep(0.05)

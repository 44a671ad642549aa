"""Table maintenance of a flow's Delta tables: OPTIMIZE, then VACUUM without starving a reader.

Streaming commits leave many small files (one or a few per micro-batch and table), and every
reader pays for each of them; MERGE rewrites leave the replaced files behind. :func:`maintain_flow`
runs, on each table of a flow that exists (bronze, silver events / quarantine / current and its
``__deleted_keys`` side table / history):

1. ``OPTIMIZE`` (bin-packing; ``ZORDER BY`` the spec's ``z_order_by``; a table created with
   ``cluster_by`` is clustered by plain OPTIMIZE). OPTIMIZE commits with ``dataChange = false``,
   so the streams that read the table as a Delta source skip its commit instead of reading the
   rows twice, and appends racing it (bronze, events, quarantine) do not conflict with it.
2. ``VACUUM ... RETAIN <hours> HOURS``, which deletes the files no table version within the
   retention needs. The retention is the slowest reader's (:func:`vacuum_retention`):

   * the spec's ``maintenance.vacuum_retention`` (at least 7 days, validated): time travel, CDF
     readers outside Conflux (the current table's ``_change_data`` files are vacuumed like data
     files), and any stream outside Conflux must not fall further behind than this;
   * the table's own ``delta.deletedFileRetentionDuration``, if longer (Delta's
     ``retentionDurationCheck`` stays on and would refuse less);
   * the streams of the flow that read the table: the silver stage's own query (``chaining:
     stream``) reads the bronze table from the position recorded in its checkpoint
     (``offsets/<n>``: ``reservoirVersion``). Every file it still needs was added at or after
     that version, so it was removed (if at all) after that version's commit: a retention longer
     than the age of that commit (plus :data:`STREAM_MARGIN`) keeps them all, so a silver stream
     that is days behind (stopped, or rebuilding) still catches up. If the version's commit
     cannot be dated, the table is not vacuumed at all.

**What maintenance never shortens.** Exactly-once rests on Delta's transaction ids
(``txnAppId`` / ``txnVersion``, see :mod:`pipelines.delta_writes`): a batch replayed after a crash
is skipped because the table's snapshot still holds its app id's version. Delta keeps those ids in
the snapshot for as long as the table lives, unless ``delta.setTransactionRetentionDuration`` is
set, and keeps log entries for ``delta.logRetentionDuration`` (30 days by default; a stream can
only restart from a version whose log entries exist). The spec refuses less than 7 days for both;
maintenance sets neither, never deletes log files itself (Delta cleans its log at checkpoints),
and never reads a checkpoint other than to learn a stream's position: it writes nothing there.

**Maintenance never fails the stream, nor the other tables.** It runs beside a running flow (its
own Spark session; in Dagster outside the flow's pool). Appends (bronze, events, quarantine) never
conflict with OPTIMIZE. A MERGE (current, history and the deleted-keys side table) does: whichever
of the two commits second loses. A MERGE that loses is retried by the silver stage under the same
transaction version (:func:`pipelines.delta_writes.retry_on_maintenance`); a maintenance command
that loses (Delta's concurrent-modification errors) is retried here :data:`ATTEMPTS` times with
exponential backoff, then reported as failed for that table. Any failure of one table is reported
and the next table is maintained.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pyspark.sql import SparkSession

from pipelines.catalog.tables import CatalogTable
from pipelines.location import Location
from pipelines.retention import (
    COMMIT_FILE,
    StreamReader,
    UndatedVersionError,
    flow_tables,
    latest_version,
    stream_needs,
    stream_readers,
    vacuum_retention,
)
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

#: Tries of one maintenance command that loses commit races (the first one included).
ATTEMPTS = 4
#: Seconds before the first retry; doubled before each further one.
BACKOFF_SECONDS = 2.0

#: Delta's commit-conflict exceptions (``io.delta.exceptions.*``, converted by ``delta.exceptions``)
#: and the error classes they carry: a retry reads the new snapshot and may well succeed.
CONFLICT_EXCEPTIONS = frozenset(
    {
        "DeltaConcurrentModificationException",
        "ConcurrentWriteException",
        "MetadataChangedException",
        "ProtocolChangedException",
        "ConcurrentAppendException",
        "ConcurrentDeleteReadException",
        "ConcurrentDeleteDeleteException",
        "ConcurrentTransactionException",
    }
)
_CONFLICT_TEXT = re.compile(
    r"io\.delta\.exceptions\.\w*Concurrent\w*|"
    r"\b(" + "|".join(CONFLICT_EXCEPTIONS) + r")\b|"
    r"\bDELTA_(CONCURRENT_\w+|METADATA_CHANGED|PROTOCOL_CHANGED)\b"
)
T = TypeVar("T")


# --- running the commands -------------------------------------------------------------------------


def is_commit_conflict(error: BaseException) -> bool:
    """A Delta concurrent-modification error anywhere in ``error``'s chain (worth a retry)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in CONFLICT_EXCEPTIONS for cls in type(current).__mro__):
            return True
        if _CONFLICT_TEXT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def first_line(error: BaseException) -> str:
    """The first line of an error's message (a Spark error's message carries its stack trace)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class MaintenanceCommandError(Exception):
    """One maintenance command failed for good (after its retries, if it lost commit races)."""

    def __init__(self, operation: str, attempts: int, cause: BaseException) -> None:
        self.operation, self.attempts, self.cause = operation, attempts, cause
        first = first_line(cause)
        conflict = is_commit_conflict(cause)
        hint = (
            "; a writer kept winning the commit race: the next maintenance run tries again"
            if conflict
            else ""
        )
        super().__init__(f"{operation} failed after {attempts} attempt(s): {first}{hint}")


def retrying(
    operation: str,
    run: Callable[[], T],
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[T, int]:
    """``run()`` and the attempts it took; commit conflicts are retried with exponential backoff.

    Raises:
        MaintenanceCommandError: any other error at once, a conflict after ``attempts`` tries.
    """
    for attempt in range(1, attempts + 1):
        try:
            return run(), attempt
        except Exception as exc:
            if attempt == attempts or not is_commit_conflict(exc):
                raise MaintenanceCommandError(operation, attempt, exc) from exc
            sleep(backoff * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _quoted(path: Location) -> str:
    return "delta.`" + str(path).replace("`", "``") + "`"


def _identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class Detail:
    files: int
    bytes: int
    properties: Mapping[str, str]


def describe(spark: SparkSession, path: Location) -> Detail:
    """``DESCRIBE DETAIL``: the files of the table's latest version, their bytes, its properties."""
    row = spark.sql(f"DESCRIBE DETAIL {_quoted(path)}").first()
    assert row is not None
    return Detail(int(row["numFiles"] or 0), int(row["sizeInBytes"] or 0), row["properties"] or {})


def run_optimize(spark: SparkSession, table: CatalogTable) -> dict[str, int]:
    """OPTIMIZE (Z-ordered when the spec asks); the files it removed and added."""
    statement = f"OPTIMIZE {_quoted(table.path)}"
    if table.z_order_by:
        statement += f" ZORDER BY ({', '.join(_identifier(c) for c in table.z_order_by)})"
    row = spark.sql(statement).first()
    metrics = row["metrics"] if row is not None else None
    if metrics is None:
        return {"removed": 0, "added": 0}
    return {"removed": int(metrics["numFilesRemoved"]), "added": int(metrics["numFilesAdded"])}


#: VACUUM lists the table's folder with this many Spark tasks: Spark's default (10,000) costs half a
#: minute per table on two cores, whatever the table's size.
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_SPARK_DEFAULT_LISTING_PARALLELISM = "10000"


def vacuum_session(spark: SparkSession) -> SparkSession:
    """A session of its own for VACUUM (same context, own SQL conf: a stream sharing ``spark``
    is not affected) listing files with the cluster's default parallelism, unless the user set
    :data:`LISTING_PARALLELISM`."""
    session = spark.newSession()
    if spark.conf.get(LISTING_PARALLELISM, None) in (None, _SPARK_DEFAULT_LISTING_PARALLELISM):
        session.conf.set(LISTING_PARALLELISM, str(spark.sparkContext.defaultParallelism))
    return session


def run_vacuum(spark: SparkSession, path: Location, hours: int) -> int | None:
    """VACUUM with ``hours`` of retention; the files it deleted (from its ``VACUUM END`` commit,
    None when Delta's vacuum logging is off)."""
    before = latest_version(path)
    vacuum_session(spark).sql(f"VACUUM {_quoted(path)} RETAIN {hours} HOURS").collect()
    history = spark.sql(f"DESCRIBE HISTORY {_quoted(path)} LIMIT 20").collect()
    for row in history:  # newest first; writers may have committed after VACUUM ended
        if row["operation"] == "VACUUM END" and int(row["version"]) > before:
            return int((row["operationMetrics"] or {}).get("numDeletedFiles", 0))
    return None


# --- the report -----------------------------------------------------------------------------------


@dataclass
class TableReport:
    """What maintenance did to one table."""

    role: str
    table: str
    path: str
    status: Literal["ok", "failed"] = "ok"
    #: Files and bytes of the table's latest version when its maintenance started and ended; a
    #: running flow adds files in between, so OPTIMIZE's own effect is ``files_removed`` ->
    #: ``files_added``.
    files_before: int | None = None
    files_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    optimized: bool = False
    files_removed: int | None = None  # by OPTIMIZE, compacted into files_added
    files_added: int | None = None
    vacuumed: bool = False
    files_vacuumed: int | None = None
    retention_hours: int | None = None
    retention_reason: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line for logs and the CLI."""
        parts = [f"{self.role} table {self.table}: {self.status}"]
        if self.files_before is not None and self.files_after is not None:
            parts.append(
                f"files {self.files_before} -> {self.files_after}, "
                f"{_mb(self.bytes_before)} -> {_mb(self.bytes_after)} MB"
            )
        if self.optimized:
            parts.append(f"OPTIMIZE compacted {self.files_removed} file(s) into {self.files_added}")
        if self.vacuumed:
            deleted = "?" if self.files_vacuumed is None else self.files_vacuumed
            parts.append(
                f"VACUUM deleted {deleted} file(s), retention {self.retention_hours} h "
                f"({self.retention_reason})"
            )
        parts.append(f"{self.seconds:.1f} s")
        line = "; ".join(parts)
        return (
            line
            + "".join(f"\n  note: {n}" for n in self.notes)
            + "".join(f"\n  error: {e}" for e in self.errors)
        )


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / 1e6:.2f}"


# --- a flow ---------------------------------------------------------------------------------------


def is_delta_table(path: Location) -> bool:
    names = (path / "_delta_log").names()
    return any(COMMIT_FILE.match(name) or name == "_last_checkpoint" for name in names)


def maintain_flow(
    spark: SparkSession,
    spec: FlowSpec,
    settings: Settings,
    *,
    optimize: bool | None = None,
    vacuum: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[TableReport]:
    """OPTIMIZE and / or VACUUM (default: as the spec's ``maintenance`` says) every existing table
    of the flow, one after the other; a failing table is reported, never raised past the others.
    """
    do_optimize = spec.maintenance.optimize if optimize is None else optimize
    do_vacuum = spec.maintenance.vacuum if vacuum is None else vacuum
    readers = stream_readers(spec, settings)
    reports = []
    for table in flow_tables(spec, settings):
        if is_delta_table(table.path):
            reports.append(
                maintain_table(spark, spec, table, readers, do_optimize, do_vacuum, sleep)
            )
    return reports


def maintain_table(
    spark: SparkSession,
    spec: FlowSpec,
    table: CatalogTable,
    readers: Sequence[StreamReader],
    do_optimize: bool,
    do_vacuum: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> TableReport:
    """OPTIMIZE then VACUUM one table; each step's failure is recorded and the next step runs."""
    started = time.monotonic()
    report = TableReport(table.id, table.name, str(table.path))
    where = (
        f"{spec.spec_file}: {table.spec_field}: the {table.id} table {table.name} at {table.path}"
    )

    def failed(error: str) -> None:
        report.status = "failed"
        report.errors.append(f"{where}: {error}")

    try:
        before = describe(spark, table.path)
        report.files_before, report.bytes_before = before.files, before.bytes
    except Exception as exc:
        failed(f"DESCRIBE DETAIL failed: {first_line(exc)}")
        report.seconds = round(time.monotonic() - started, 3)
        return report
    if do_optimize:
        what = "OPTIMIZE" + (
            f" ZORDER BY ({', '.join(table.z_order_by)})" if table.z_order_by else ""
        )
        try:
            files, attempts = retrying(what, lambda: run_optimize(spark, table), sleep=sleep)
            report.optimized = True
            report.files_removed, report.files_added = files["removed"], files["added"]
            report.attempts += attempts
        except MaintenanceCommandError as exc:
            report.attempts += exc.attempts
            zorder = table.z_order_by and not is_commit_conflict(exc.cause)
            fix = f" (check {table.spec_field}.z_order_by)" if zorder else ""
            failed(f"{exc}{fix}")
    if do_vacuum:
        _vacuum_table(spark, spec, table, readers, before.properties, report, failed, sleep)
    try:
        after = describe(spark, table.path)
        report.files_after, report.bytes_after = after.files, after.bytes
    except Exception as exc:
        failed(f"DESCRIBE DETAIL failed: {first_line(exc)}")
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _vacuum_table(
    spark: SparkSession,
    spec: FlowSpec,
    table: CatalogTable,
    readers: Sequence[StreamReader],
    properties: Mapping[str, str],
    report: TableReport,
    failed: Callable[[str], None],
    sleep: Callable[[float], None],
) -> None:
    try:
        needs = stream_needs(readers, table)
    except (UndatedVersionError, OSError, ValueError) as exc:
        # Not knowing how far behind a stream is, any retention could delete what it needs.
        report.notes.append(f"VACUUM skipped: a stream's position is unknown ({exc})")
        return
    retention = vacuum_retention(
        spec.maintenance.vacuum_retention,
        properties.get("delta.deletedFileRetentionDuration"),
        needs,
        datetime.now(UTC),
    )
    report.retention_hours, report.retention_reason = retention.hours, retention.reason
    try:
        deleted, attempts = retrying(
            f"VACUUM RETAIN {retention.hours} HOURS",
            lambda: run_vacuum(spark, table.path, retention.hours),
            sleep=sleep,
        )
        report.vacuumed, report.files_vacuumed = True, deleted
        report.attempts += attempts
    except MaintenanceCommandError as exc:
        report.attempts += exc.attempts
        failed(str(exc))

"""Dagster asset checks that run a silver table's Great Expectations suite (``quality/suites.py``).

Each silver table whose spec declares a ``suite:`` gets a check ``gx_suite`` on its asset, run on
dagster-pyspark's ``pyspark`` resource in the run's own process (short Spark work, not a stream).
A job that materializes the flow runs it after the flow's step; ``blocking: true`` makes a failed
suite (severity ERROR) stop the assets downstream of the table in that run. A continuous run has
no downstream step: there the suite runs when launched from the UI (the check's "Execute"), and
what stops a stream is a ``fail`` expectation in the stream itself.

``scope: run`` validates only the rows the latest run that materialized the table added: for the
append-only events and quarantine tables, the rows of that run's batches (its materializations
carry :data:`RUN_FIRST_BATCH_ID` and ``last_batch_id``); for the current and history tables, the
rows it wrote (``_updated_at`` from the run's start). Executed alone, the check looks at the
latest such run.

The result shows, per expectation, its arguments, whether it passed, the observed value or the
number of unexpected rows, and a sample of unexpected values (metadata ``expectations``, a
Markdown table), plus each failed expectation as its own metadata entry.
"""

from collections.abc import Mapping
from datetime import UTC, datetime

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    asset_check,
)
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.spec import FlowSpec, SilverTable, TableSuite
from quality.checks import RUN_FIRST_BATCH_ID
from quality.suites import validate_frame

CHECK_NAME = "gx_suite"
#: The column holding the batch id (append-only tables) or the write time (MERGEd ones), by role.
_BATCH_COLUMN = {"events": "_batch_id", "quarantine": "batch_id"}


def silver_tables(spec: FlowSpec) -> dict[str, SilverTable]:
    """The flow's silver table specs by role (events, quarantine, current, history)."""
    silver = spec.silver
    if silver is None:
        return {}
    tables: dict[str, SilverTable | None] = {
        "events": silver.events,
        "quarantine": silver.quarantine,
        "current": silver.current,
        "history": silver.history,
    }
    return {role: table for role, table in tables.items() if table is not None}


def suite_checks(
    spec: FlowSpec, keys: Mapping[str, AssetKey], paths: Mapping[str, str]
) -> list[AssetChecksDefinition]:
    """One ``gx_suite`` check per silver table of ``spec`` that declares a suite."""
    return [
        _suite_check(spec, role, table.table, table.suite, keys[role], paths[role])
        for role, table in silver_tables(spec).items()
        if table.suite is not None
    ]


def _suite_check(
    spec: FlowSpec, role: str, table: str, suite: TableSuite, key: AssetKey, path: str
) -> AssetChecksDefinition:
    @asset_check(
        asset=key,
        name=CHECK_NAME,
        blocking=suite.blocking,
        description=f"Great Expectations suite of the {role} table {table} ({spec.spec_file}: "
        f"silver.{role}.suite){'; blocking' if suite.blocking else ''}.",
    )
    def _check(
        context: AssetCheckExecutionContext, pyspark: LazyPySparkResource
    ) -> AssetCheckResult:
        spark = pyspark.spark_session
        try:
            frame = spark.read.format("delta").load(path)
        except Exception as exc:  # not written yet: nothing to vouch for
            return AssetCheckResult(
                passed=False,
                severity=AssetCheckSeverity.ERROR,
                description=f"the table at {path} cannot be read: {str(exc).splitlines()[0]}",
            )
        scope = f"table {table}"
        if suite.scope == "run":
            frame, scope = _run_rows(context, key, role, frame)
        outcome = validate_frame(frame, table, suite)
        failed = {
            f"failed: {e.expectation} {e.kwargs.get('column', e.kwargs.get('column_list', ''))}": (
                MetadataValue.text(e.line())
            )
            for e in outcome.failed
        }
        context.log.info(f"{table}: {len(outcome.failed)} of {len(outcome.expectations)} failed")
        return AssetCheckResult(
            passed=outcome.success,
            severity=AssetCheckSeverity.ERROR,
            description=f"{len(outcome.failed)} of {len(outcome.expectations)} expectations "
            f"failed on {outcome.rows} rows ({scope})",
            metadata={
                "rows": MetadataValue.int(outcome.rows),
                "scope": MetadataValue.text(scope),
                "expectations": MetadataValue.md(outcome.markdown()),
                **failed,
            },
        )

    return _check


def _run_rows(
    context: AssetCheckExecutionContext, key: AssetKey, role: str, frame: DataFrame
) -> tuple[DataFrame, str]:
    """The rows of ``frame`` that the latest run materializing ``key`` added, and what they are.

    No such run yet: no rows (the suite then judges an empty frame: a row count fails it).
    """
    event = context.instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization if event is not None else None
    if event is None or materialization is None:
        return frame.limit(0), "no run has materialized the table yet"
    run_id = event.run_id
    metadata = materialization.metadata
    if role in _BATCH_COLUMN:
        first, last = metadata.get(RUN_FIRST_BATCH_ID), metadata.get("last_batch_id")
        if first is None or last is None:
            return frame.limit(0), f"run {run_id[:8]} wrote no batch"
        low, high = int(str(first.value)), int(str(last.value))
        rows = frame.where(F.col(_BATCH_COLUMN[role]).between(low, high))
        return rows, f"rows of run {run_id[:8]}: batches {low}-{high}"
    record = context.instance.get_run_record_by_id(run_id)
    started = record.start_time if record is not None else None
    if started is None:
        return frame.limit(0), f"run {run_id[:8]} has no start time"
    since = datetime.fromtimestamp(started, UTC)
    rows = frame.where(F.col("_updated_at") >= F.timestamp_seconds(F.lit(float(started))))
    return rows, f"rows run {run_id[:8]} wrote (_updated_at from {since:%Y-%m-%d %H:%M:%S} UTC)"

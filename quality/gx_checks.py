"""Dagster asset checks that run a silver table's Great Expectations suite (``quality/suites.py``).

Each silver table whose spec declares a ``suite:`` gets a check ``gx_suite`` on its asset, run on
dagster-pyspark's ``pyspark`` resource in the run's own process (short Spark work, not a stream).
A job that materializes the flow runs it after the flow's step; ``blocking: true`` makes a failed
suite (severity ERROR) stop the assets downstream of the table in that run. A continuous run has
no downstream step: there the suite runs when launched from the UI (the check's "Execute"), and
what stops a stream is a ``fail`` expectation in the stream itself.

The result shows, per expectation, its arguments, whether it passed, the observed value or the
number of unexpected rows, and a sample of unexpected values (metadata ``expectations``, a
Markdown table), plus each failed expectation as its own metadata entry.
"""

from collections.abc import Mapping
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    asset_check,
)
from dagster_pyspark import PySparkResource

from pipelines.spec import FlowSpec, SilverTable, TableSuite
from quality.suites import validate_frame

CHECK_NAME = "gx_suite"


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
    spec: FlowSpec, keys: Mapping[str, AssetKey], paths: Mapping[str, Path]
) -> list[AssetChecksDefinition]:
    """One ``gx_suite`` check per silver table of ``spec`` that declares a suite."""
    return [
        _suite_check(spec, role, table.table, table.suite, keys[role], str(paths[role]))
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
    def _check(context: AssetCheckExecutionContext, pyspark: PySparkResource) -> AssetCheckResult:
        spark = pyspark.spark_session
        try:
            frame = spark.read.format("delta").load(path)
        except Exception as exc:  # not written yet: nothing to vouch for
            return AssetCheckResult(
                passed=False,
                severity=AssetCheckSeverity.ERROR,
                description=f"the table at {path} cannot be read: {str(exc).splitlines()[0]}",
            )
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
            f"failed on {outcome.rows} rows",
            metadata={
                "rows": MetadataValue.int(outcome.rows),
                "expectations": MetadataValue.md(outcome.markdown()),
                **failed,
            },
        )

    return _check

"""Great Expectations 1.x suites of silver tables, built from the spec and run on Spark.

A table's ``suite:`` in the flow spec (:class:`pipelines.spec.TableSuite`) becomes one GX
:class:`~great_expectations.ExpectationSuite` (:func:`build_suite`):

==================  ===========================================================================
spec                GX expectation
==================  ===========================================================================
``not_null``        ``ExpectColumnValuesToNotBeNull`` per column
``unique``          ``ExpectColumnValuesToBeUnique`` (one column) or
                    ``ExpectCompoundColumnsToBeUnique`` (several: the key)
``values_in_set``   ``ExpectColumnValuesToBeInSet`` per column
``between``         ``ExpectColumnValuesToBeBetween`` per column
``row_count``       ``ExpectTableRowCountToBeBetween``
``freshness``       ``ExpectColumnMaxToBeBetween`` with ``min_value`` = now - ``max_age``
==================  ===========================================================================

:func:`validate_table` runs it on the table's current version read by Spark, through an
ephemeral GX context (no GX project on disk: the suite is code, the spec its configuration) and
a Spark dataframe data source, and returns what each expectation observed, so the Dagster check
(``quality/gx_checks.py``) can show the expectation, the observed value and a sample of the
unexpected values. GX is called directly: dagster-ge supports only GX < 1.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame

from pipelines.spec import TableSuite

#: Unexpected values shown per failed expectation.
SAMPLE_VALUES = 5
_UNITS = {"second": "seconds", "minute": "minutes", "hour": "hours", "day": "days"}


def max_age(interval: str) -> timedelta:
    """``"1 hour"`` as a timedelta (the spec validated the form)."""
    match = re.match(r"^\s*(\d+)\s*(second|minute|hour|day)s?\s*$", interval)
    assert match is not None, interval
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def build_suite(
    name: str, suite: TableSuite, now: datetime | None = None, context: Any = None
) -> Any:
    """The GX suite of ``suite`` (``now`` anchors the freshness bound; default: the clock), in
    ``context`` (default: a new ephemeral one; GX builds suites in an active context)."""
    import great_expectations as gx
    from great_expectations import expectations as gxe

    if context is None:
        gx.get_context(mode="ephemeral")
    built = gx.ExpectationSuite(name=name)
    for column in suite.not_null:
        built.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=column))
    if len(suite.unique) == 1:
        built.add_expectation(gxe.ExpectColumnValuesToBeUnique(column=suite.unique[0]))
    elif suite.unique:
        built.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=list(suite.unique)))
    for column, values in suite.values_in_set.items():
        built.add_expectation(
            gxe.ExpectColumnValuesToBeInSet(column=column, value_set=list(values))
        )
    for column, bounds in suite.between.items():
        built.add_expectation(
            gxe.ExpectColumnValuesToBeBetween(
                column=column, min_value=bounds.min, max_value=bounds.max
            )
        )
    if suite.row_count is not None:
        built.add_expectation(
            gxe.ExpectTableRowCountToBeBetween(
                min_value=suite.row_count.min, max_value=suite.row_count.max
            )
        )
    if suite.freshness is not None:
        oldest = (now or datetime.now(UTC)) - max_age(suite.freshness.max_age)
        built.add_expectation(
            gxe.ExpectColumnMaxToBeBetween(
                column=suite.freshness.column,
                min_value=oldest.replace(tzinfo=None),
                strict_min=False,
            )
        )
    return built


@dataclass(frozen=True)
class ExpectationOutcome:
    """What one expectation of a suite found."""

    expectation: str
    kwargs: dict[str, Any]
    success: bool
    observed: Any = None
    unexpected_count: int | None = None
    unexpected_sample: list[Any] = field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        """One Markdown table row: expectation, arguments, result, observed, sample."""
        arguments = ", ".join(f"{k}={v}" for k, v in self.kwargs.items() if k != "batch_id")
        if self.error:
            found = f"error: {self.error}"
        elif self.unexpected_count is not None:
            found = f"{self.unexpected_count} unexpected"
        else:
            found = f"observed {self.observed}"
        sample = ", ".join(str(v) for v in self.unexpected_sample) if self.unexpected_sample else ""
        verdict = "passed" if self.success else "FAILED"
        return f"| {self.expectation} | {arguments} | {verdict} | {found} | {sample} |"


@dataclass(frozen=True)
class SuiteOutcome:
    table: str
    success: bool
    rows: int
    expectations: tuple[ExpectationOutcome, ...]

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [e for e in self.expectations if not e.success]

    def markdown(self) -> str:
        header = "| expectation | arguments | result | found | unexpected (sample) |\n|---|---|---|---|---|"
        return "\n".join([header, *(e.line() for e in self.expectations)])


def validate_frame(frame: DataFrame, table: str, suite: TableSuite) -> SuiteOutcome:
    """Run ``suite`` on ``frame`` (the table's rows) with an ephemeral GX context."""
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    source = context.data_sources.add_spark(name=f"conflux_{uuid.uuid4().hex[:8]}")
    asset = source.add_dataframe_asset(name=table)
    batch = asset.add_batch_definition_whole_dataframe("whole_table").get_batch(
        batch_parameters={"dataframe": frame}
    )
    result = batch.validate(
        build_suite(f"{table}_suite", suite, context=context),
        result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_VALUES},
    )
    outcomes = []
    for item in result.results:
        found = item.result or {}
        error = None
        if item.exception_info and item.exception_info.get("raised_exception"):
            error = str(item.exception_info.get("exception_message"))
        outcomes.append(
            ExpectationOutcome(
                expectation=item.expectation_config.type,
                kwargs=dict(item.expectation_config.kwargs),
                success=bool(item.success),
                observed=_plain(found.get("observed_value")),
                unexpected_count=found.get("unexpected_count"),
                unexpected_sample=[_plain(v) for v in (found.get("partial_unexpected_list") or [])][
                    :SAMPLE_VALUES
                ],
                error=error,
            )
        )
    return SuiteOutcome(
        table=table,
        success=bool(result.success),
        rows=frame.count(),
        expectations=tuple(outcomes),
    )


def _plain(value: Any) -> Any:
    """JSON-friendly: timestamps as ISO text, Spark Rows as dicts."""
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return value.asDict()
    return value

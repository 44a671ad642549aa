"""Row expectations of the silver stage, and the per-batch accounting of where every row went.

The spec's ``silver.expectations`` (:class:`pipelines.spec.Expectation`: a SQL expression or a
named rule of :mod:`quality.rules`) are evaluated on the parsed rows of a micro-batch, all of them
in the same projection as the parsing (:func:`with_expectations` adds one array column naming the
expectations each row failed), and counted in the one aggregation the stage runs over the
held batch anyway (:func:`batch_aggregates`). Nothing is collected per rule and no rule scans
the batch again.

* ``warn``: the row is kept and counted;
* ``drop``: the row gets ``expectation <name> failed: <expectation>`` among its quarantine
  reasons, so it goes to the quarantine instead of the silver tables;
* ``fail``: the aggregation carries a sample failing row, and the stage raises
  :class:`ExpectationFailedError` before any write: nothing of the batch is committed anywhere,
  the query fails and the flow stops. Its offsets stay planned, so the next start replays the
  same batch under the spec as it is then (see :func:`failure_message` for the ways forward).

Only rows that parsed are judged: a row quarantined for a parse failure, a missing key or a null
sequence is never also counted against an expectation.

The accounting (:class:`BatchQuality`): every bronze row of a batch is exactly one of an event
handed to the silver writers, a quarantined row, or an ignored Debezium tombstone, and the stage
records the three counts with each batch (progress, and from there Dagster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from pipelines.messages import QUALITY_COUNTS, BatchQuality, ExpectationCount
from pipelines.silver.parse import IGNORED, REASONS, TRUNCATE, UNAVAILABLE, parsed_event
from pipelines.spec import Expectation
from quality.rules import rule_column

#: Names of the expectations a parsed row failed (empty for a row that passed all, or that did
#: not parse).
FAILED = "_failed_expectations"
#: A failing row shown in an error is cut to this many characters of JSON.
SAMPLE_CHARS = 2000


class ExpectationFailedError(RuntimeError):
    """A ``fail`` expectation failed on rows of a batch; nothing of the batch was written.

    ``names``: the expectations that failed (their checks fail with the flow's stop)."""

    def __init__(self, message: str, names: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.names = tuple(names)


def passes(expectation: Expectation) -> Column:
    """True when a row meets ``expectation`` (false or null fail it)."""
    if expectation.expr is not None:
        condition = F.expr(expectation.expr)
    else:
        assert expectation.rule is not None
        condition = rule_column(expectation.rule, expectation.args)
    return F.coalesce(condition, F.lit(False))


def with_expectations(parsed: DataFrame, expectations: Sequence[Expectation]) -> DataFrame:
    """``parsed`` with :data:`FAILED`, and ``drop`` failures added to its reasons."""
    if not expectations:
        return parsed.withColumn(FAILED, F.array().cast("array<string>"))
    failed = F.filter(
        F.array(*(F.when(~passes(e), F.lit(e.name)) for e in expectations)),
        lambda name: name.isNotNull(),
    )
    frame = parsed.withColumn(
        # A TRUNCATE has no row to judge.
        FAILED,
        F.when(parsed_event() & (F.col("_op") != TRUNCATE), failed).otherwise(
            F.array().cast("array<string>")
        ),
    )
    dropping = [e for e in expectations if e.action == "drop"]
    if not dropping:
        return frame
    reasons = F.filter(
        F.array(
            *(
                F.when(
                    F.array_contains(F.col(FAILED), e.name),
                    F.lit(f"expectation {e.name} failed: {e.describe()}"),
                )
                for e in dropping
            )
        ),
        lambda reason: reason.isNotNull(),
    )
    return frame.withColumn(REASONS, F.concat(F.col(REASONS), reasons))


def batch_aggregates(
    expectations: Sequence[Expectation], row_columns: Sequence[str]
) -> list[Column]:
    """The aggregate columns of one pass over a parsed batch (after :func:`with_expectations`):
    the kinds of rows, deletes, and per expectation its failures (with a sample failing row for
    a ``fail`` one)."""
    event = parsed_event()
    flagged = F.size(F.col(FAILED)) > 0
    columns = [
        F.count(F.lit(1)).alias("rows_in"),
        F.count_if(event).alias("events"),
        F.count_if(F.size(F.col(REASONS)) > 0).alias("quarantined"),
        F.count_if(F.col(IGNORED)).alias("ignored"),
        F.count_if(event & (F.col("_op") == "d")).alias("deletes"),
        F.count_if(event & (F.col("_op") == TRUNCATE)).alias("truncates"),
        # Whatever the expectations made of the row: they judged it before the carry.
        F.count_if(F.size(F.col(UNAVAILABLE)) > 0).alias("unavailable"),
        F.count_if(event & ~flagged).alias("passed"),
        F.count_if(event & flagged).alias("warned"),
        F.count_if(~event & flagged).alias("dropped"),
    ]
    sample = F.substring(
        F.to_json(F.struct(*row_columns, "_source_partition", "_source_offset")), 1, SAMPLE_CHARS
    )
    for index, expectation in enumerate(expectations):
        failed = F.array_contains(F.col(FAILED), expectation.name)
        columns.append(F.count_if(failed).alias(f"failed_{index}"))
        if expectation.action == "fail":
            columns.append(
                F.first(F.when(failed, sample), ignorenulls=True).alias(f"sample_{index}")
            )
    return columns


def batch_quality(
    counts: Row | Mapping[str, Any],
    expectations: Sequence[Expectation],
    written: int,
    columns_added: Sequence[str] = (),
) -> BatchQuality:
    """:class:`BatchQuality` from the row of :func:`batch_aggregates` (and of
    :func:`pipelines.silver.schema_changes.aggregates`)."""
    return BatchQuality(
        **{name: int(counts[name]) for name in QUALITY_COUNTS},
        written=written,
        columns_added=tuple(columns_added),
        expectations=tuple(
            ExpectationCount(e.name, e.action, int(counts[f"failed_{i}"]), e.describe())
            for i, e in enumerate(expectations)
        ),
    )


def failures(
    counts: Row | Mapping[str, Any], expectations: Sequence[Expectation]
) -> list[tuple[Expectation, int, str | None]]:
    """``(expectation, failed rows, a failing row as JSON)`` of each ``fail`` expectation that
    failed in the batch."""
    return [
        (e, int(counts[f"failed_{i}"]), counts[f"sample_{i}"])
        for i, e in enumerate(expectations)
        if e.action == "fail" and int(counts[f"failed_{i}"]) > 0
    ]


def failure_message(
    flow: str, spec_file: str, batch_id: int, failed: list[tuple[Expectation, int, str | None]]
) -> str:
    """Why the batch stopped the flow, a failing row, and how to get past it."""
    parts = [
        f"expectation {e.name} ({e.describe()}) failed on {n} row(s); a failing row: "
        f"{sample or '?'}"
        for e, n, sample in failed
    ]
    names = ", ".join(e.name for e, _, _ in failed)
    return (
        f"flow {flow}: silver batch {batch_id}: {'; '.join(parts)}. Action fail: nothing of "
        "the batch was written, and every start replays this same batch (its records are in "
        f"bronze already; corrections sent upstream arrive as new records). To get past it, "
        f"change the expectation in {spec_file} (silver.expectations): fix a wrong rule, or set "
        "its action to drop (the failing rows go to the quarantine with the rule's name) or "
        f"warn; then start the flow again. [failed expectations: {names}]"
    )

"""Data quality the spec declares: row expectations of the silver stage, and table suites.

A named rule's arguments are checked against its signature in :mod:`quality.rules` when the spec
loads; that module imports nothing of ``pipelines``, so the dependency goes one way only.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from quality.rules import RULES, RuleError, check_rule_args, rule_columns

from .base import _error, _Model
from .values import Identifier, Retention, SqlFragment

Scalar = StrictInt | StrictFloat | StrictStr


class _Range(_Model):
    """A model with ``min`` and ``max`` fields, at least one of them given."""

    @model_validator(mode="after")
    def _some_bound(self) -> _Range:
        if getattr(self, "min", None) is None and getattr(self, "max", None) is None:
            raise _error("give min, max or both")
        return self


class Bounds(_Range):
    """An inclusive range of numbers, dates or timestamps; give ``min``, ``max`` or both."""

    min: StrictInt | StrictFloat | datetime | date | None = Field(
        default=None, description="Lowest allowed value (inclusive)."
    )
    max: StrictInt | StrictFloat | datetime | date | None = Field(
        default=None, description="Highest allowed value (inclusive)."
    )


class RowCount(_Range):
    """How many rows a table may hold; give ``min``, ``max`` or both."""

    min: Annotated[StrictInt, Field(ge=0)] | None = Field(default=None, description="At least.")
    max: Annotated[StrictInt, Field(ge=0)] | None = Field(default=None, description="At most.")


class Freshness(_Model):
    """The newest value of a timestamp column is at most ``max_age`` old."""

    column: Identifier = Field(
        default="_event_time", description="The timestamp column; default: the event time."
    )
    max_age: Retention = Field(description="How old the newest value may be, e.g. `1 hour`.")


class TableSuite(_Model):
    """A Great Expectations suite run on the table as a Dagster asset check (``gx_suite``) after
    the flow's runs, and on demand from the UI (``quality/suites.py``)."""

    scope: Literal["table", "run"] = Field(
        default="table",
        description="What the suite validates: the whole `table` at its current version, or the "
        "rows the latest run that materialized the table added (`run`: events and quarantine "
        "rows of its batches; current and history rows it updated).",
    )
    blocking: StrictBool = Field(
        default=False,
        description="A failing suite stops the assets downstream of this table in the same run "
        "(incremental and backfill runs; a continuous run has no downstream step: its `fail` "
        "expectations are what stops it).",
    )
    not_null: tuple[Identifier, ...] = Field(default=(), description="Columns without nulls.")
    unique: tuple[Identifier, ...] = Field(
        default=(), description="Columns whose values together are unique (e.g. the keys)."
    )
    values_in_set: dict[Identifier, tuple[Scalar, ...]] = Field(
        default_factory=dict, description="Per column, the values it may hold."
    )
    between: dict[Identifier, Bounds] = Field(
        default_factory=dict, description="Per column, the range its values lie in."
    )
    row_count: RowCount | None = Field(default=None, description="How many rows the table holds.")
    freshness: Freshness | None = Field(
        default=None, description="How recent the newest value of a timestamp column must be."
    )

    def columns(self) -> list[str]:
        """Every column the suite names."""
        named = [*self.not_null, *self.unique, *self.values_in_set, *self.between]
        return [*named, *([self.freshness.column] if self.freshness else [])]


EXPECTATION_ACTIONS = ("warn", "drop", "fail")


class Expectation(_Model):
    """A row expectation of the silver stage: a SQL boolean expression or a named rule.

    A parsed row passes when it evaluates to true (false or null fail it). ``warn`` keeps a
    failing row and counts it; ``drop`` sends it to the quarantine with
    ``expectation <name> failed`` among its reasons; ``fail`` stops the flow before anything of
    the batch is written, naming the expectation and showing a failing row.
    """

    name: Identifier = Field(
        description="Name of the expectation: in quarantine reasons, metrics and check names."
    )
    expr: SqlFragment | None = Field(
        default=None,
        description="A SQL boolean expression over the parsed row's columns and metadata, "
        "e.g. `amount >= 0`; use `try_` functions where a value may not convert.",
    )
    rule: StrictStr | None = Field(
        default=None,
        description=f"A named rule of `quality/rules.py` ({', '.join(RULES)}), with `args`.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="The rule's arguments, e.g. `{column: tier, values: [free, pro]}`.",
    )
    action: Literal["warn", "drop", "fail"] = Field(
        default="warn",
        description="What a failing row does: `warn` (kept, counted), `drop` (quarantined with "
        "the expectation's name), `fail` (the flow stops; nothing of the batch is written).",
    )

    @model_validator(mode="after")
    def _check(self) -> Expectation:
        if (self.expr is None) == (self.rule is None):
            raise _error("give either expr (SQL) or rule (a named rule), not both or neither")
        if self.rule is None:
            if self.args:
                raise _error("only with rule: an expr takes no arguments", "args")
            return self
        try:
            check_rule_args(self.rule, self.args)
        except RuleError as exc:
            raise _error(str(exc), "args" if self.rule in RULES else "rule") from None
        return self

    def columns(self) -> list[str]:
        """The row columns a rule names (an expr is analysed against the row at start)."""
        return rule_columns(self.args) if self.rule is not None else []

    def describe(self) -> str:
        """The expectation as a user wrote it: ``amount >= 0`` or ``between(column=amount, min=0)``."""
        if self.expr is not None:
            return self.expr
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.rule}({arguments})"

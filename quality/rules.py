"""Named row rules for silver expectations: plain functions returning a Spark ``Column``.

A flow spec names a rule and its arguments::

    silver:
      expectations:
        - {name: known_tier, rule: values_in_set, args: {column: tier, values: [free, pro]}}

and the silver stage evaluates ``rule(**args)`` on every parsed row, with all the other
expectations, in one projection of the micro-batch. A row passes when the column is **true**;
false or null fail it. Every rule here lets a null value pass (a missing value is
:func:`not_null`'s business), so rules combine without double-counting.

This module imports nothing of ``pipelines``: the spec (``pipelines/spec/``) imports it to validate
rules when a spec loads, so an import back would make the two packages depend on each other.

Rules are built from Spark's own functions only (no Python UDF), so they run in the JVM and need no
Python on the executors. Their parameters are annotated precisely (a column name, a non-empty
list, a regular expression that compiles), and the spec loader calls :func:`check_rule_args`,
which validates them against the rule's annotated signature (pydantic), without a Spark session.

Add a rule: write a function here with annotated parameters that returns a boolean ``Column``, and
decorate it with :func:`rule`, which registers it in :data:`RULES` under its name (a check across
its arguments goes in the decorator too). Its parameter named ``column`` is checked against the
flow's parsed row by the spec loader. Keep it deterministic (no current time, no randomness): a
batch replayed after a crash must be judged exactly as the first time.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from functools import cache
from types import MappingProxyType
from typing import Annotated, Any, TypeVar, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    create_model,
)
from pyspark.sql import Column
from pyspark.sql import functions as F


class RuleError(ValueError):
    """A rule's arguments are wrong; the message names the argument and the fix."""


RuleFunction = TypeVar("RuleFunction", bound=Callable[..., Column])
#: A check across a rule's arguments (after each is valid on its own): the problem, or None.
AcrossArguments = Callable[[Mapping[str, Any]], str | None]

_REGISTRY: dict[str, Callable[..., Column]] = {}
_ACROSS_ARGUMENTS: dict[str, AcrossArguments] = {}
#: Every rule by name, in the order they are defined (filled in by :func:`rule`).
RULES: Mapping[str, Callable[..., Column]] = MappingProxyType(_REGISTRY)


def rule(*, across: AcrossArguments | None = None) -> Callable[[RuleFunction], RuleFunction]:
    """Register the decorated function as the rule of its name; ``across`` checks its arguments
    together (e.g. at least one bound), after each is valid on its own."""

    def register(function: RuleFunction) -> RuleFunction:
        name = function.__name__
        if name in _REGISTRY:
            raise ValueError(f"rule {name!r} is registered twice")
        _REGISTRY[name] = function
        if across is not None:
            _ACROSS_ARGUMENTS[name] = across
        return function

    return register


def _column_name(value: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
        raise ValueError(f"{value!r} is not a column name")
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} does not compile: {exc}") from None
    return value


def _interval(value: str) -> str:
    if not re.match(r"^\d+\s*(second|minute|hour|day)s?$", value.strip()):
        raise ValueError(f"{value!r} is not an interval such as '5 minutes' or '1 hour'")
    return value.strip()


def _iso_time(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO date or timestamp") from None
    return value


ColumnName = Annotated[StrictStr, AfterValidator(_column_name)]
Literal_ = StrictInt | StrictFloat | StrictStr | date | datetime
Regex = Annotated[StrictStr, Field(min_length=1), AfterValidator(_regex)]
IntervalText = Annotated[StrictStr, AfterValidator(_interval)]
IsoTime = Annotated[StrictStr, AfterValidator(_iso_time)]


@rule()
def not_null(column: ColumnName) -> Column:
    """The column has a value."""
    return F.col(column).isNotNull()


@rule()
def not_empty(column: ColumnName) -> Column:
    """A string value has something besides whitespace."""
    return F.col(column).isNull() | (F.length(F.trim(F.col(column))) > 0)


@rule()
def values_in_set(
    column: ColumnName, values: Annotated[list[Literal_], Field(min_length=1)]
) -> Column:
    """The value is one of ``values`` (an enumeration: unknown values fail)."""
    return F.col(column).isNull() | F.col(column).isin(*values)


def _some_bound(args: Mapping[str, Any]) -> str | None:
    return (
        None
        if args.get("min") is not None or args.get("max") is not None
        else "give min, max or both"
    )


@rule(across=_some_bound)
def between(column: ColumnName, min: Literal_ | None = None, max: Literal_ | None = None) -> Column:  # noqa: A002
    """``min <= value <= max`` (give one bound or both); numbers, dates or timestamps."""
    value, passes = F.col(column), F.lit(True)
    if min is not None:
        passes = passes & (value >= F.lit(min))
    if max is not None:
        passes = passes & (value <= F.lit(max))
    return value.isNull() | passes


@rule()
def matches(column: ColumnName, pattern: Regex) -> Column:
    """The whole string value matches the regular expression ``pattern`` (Java syntax)."""
    return F.col(column).isNull() | F.col(column).rlike(f"^(?:{pattern})$")


@rule()
def max_length(column: ColumnName, length: Annotated[StrictInt, Field(ge=0)]) -> Column:
    """A string (characters) or binary (bytes) value is at most ``length`` long."""
    return F.col(column).isNull() | (F.length(F.col(column)) <= F.lit(length))


@rule()
def not_in_future(column: ColumnName, skew: IntervalText = "5 minutes") -> Column:
    """A timestamp is not later than the moment its record was ingested (bronze's
    ``_ingested_at``) plus ``skew``, the clock skew allowed. Not the current time: a batch
    replayed after a crash is judged exactly as the first time."""
    limit = F.col("_ingested_at") + F.expr(f"INTERVAL {skew}")
    return F.col(column).isNull() | (F.col(column).try_cast("timestamp") <= limit)


@rule()
def not_before(column: ColumnName, earliest: IsoTime = "1970-01-01") -> Column:
    """A date or timestamp is not earlier than ``earliest`` (an ISO date or timestamp)."""
    bound = F.lit(earliest).cast("timestamp")
    return F.col(column).isNull() | (F.col(column).try_cast("timestamp") >= bound)


@cache
def _arguments_model(name: str) -> type[BaseModel]:
    """A pydantic model of rule ``name``'s parameters (their annotations and defaults)."""
    function = RULES[name]
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {
        parameter.name: (
            hints[parameter.name],
            ... if parameter.default is inspect.Parameter.empty else parameter.default,
        )
        for parameter in inspect.signature(function).parameters.values()
    }
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


def signature(name: str) -> str:
    """``name(column, values)``: how the rule is called, for error messages and docs."""
    return f"{name}({', '.join(inspect.signature(RULES[name]).parameters)})"


def check_rule_args(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of rule ``name``, validated; :class:`RuleError` names what is wrong.

    Needs no Spark session: the spec loader calls it, so a bad rule fails when the spec loads.
    """
    if name not in RULES:
        raise RuleError(f"unknown rule {name!r}; known: {', '.join(sorted(RULES))}")
    try:
        validated = _arguments_model(name).model_validate(dict(args))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'args'}: {error['msg']}"
            for error in exc.errors()
        )
        raise RuleError(f"{problems} ({signature(name)})") from None
    values = validated.model_dump()
    across = _ACROSS_ARGUMENTS.get(name)
    problem = across(values) if across else None
    if problem:
        raise RuleError(f"{problem} ({signature(name)})")
    return values


def rule_column(name: str, args: Mapping[str, Any]) -> Column:
    """The boolean Column of rule ``name`` with ``args`` (validated again: cheap, and safe)."""
    return RULES[name](**check_rule_args(name, args))


def rule_columns(args: Mapping[str, Any]) -> list[str]:
    """The row columns a rule's arguments name (its ``column`` argument)."""
    column = args.get("column")
    return [column] if isinstance(column, str) else []

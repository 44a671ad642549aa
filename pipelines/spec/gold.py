"""The gold part of a spec: windowed aggregates and stream-stream joins of silver events.

A gold table is a :class:`SilverTable` (features, properties, layout) with an allowed lateness, a
late-data table and backfills; its columns are checked against the silver events in
:meth:`FlowSpec.check_event_columns`, which knows the flow.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .base import _error, _Model, _raise_all
from .columns import GOLD_METADATA_COLUMNS, JOIN_METADATA_COLUMNS
from .table import SilverTable
from .values import IDENTIFIER_RE, Cron, Duration, Identifier, TableLocation, duration_seconds

#: ``gold[].aggregates[].function`` -> whether it needs a column.
AGGREGATE_FUNCTIONS = {
    "count": False,
    "sum": True,
    "min": True,
    "max": True,
    "avg": True,
    "approx_count_distinct": True,
}


class WindowSpec(_Model):
    """An event-time window: tumbling (``duration`` alone) or sliding (``slide`` too)."""

    duration: Duration = Field(description="Length of each window, e.g. `10 minutes`.")
    slide: Duration | None = Field(
        default=None,
        description="Sliding windows: a new window starts every `slide` (shorter than "
        "`duration`, dividing it); default: tumbling windows (slide = duration).",
    )

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.slide is not None:
            length, slide = duration_seconds(self.duration), duration_seconds(self.slide)
            if slide > length or length % slide:
                raise _error(
                    f"{self.slide!r} must divide the window's duration {self.duration!r}", "slide"
                )
        return self

    @property
    def slide_seconds(self) -> int:
        return duration_seconds(self.slide or self.duration)


class Aggregate(_Model):
    """One aggregate column of a gold table."""

    name: Identifier = Field(description="Name of the column in the gold table.")
    function: Literal["count", "sum", "min", "max", "avg", "approx_count_distinct"] = Field(
        description="The aggregate function: count (rows, or non-null values of `column`), sum, "
        "min, max, avg, approx_count_distinct."
    )
    column: Identifier | None = Field(
        default=None, description="The input column (a column of the silver events)."
    )

    @model_validator(mode="after")
    def _check(self) -> Aggregate:
        if AGGREGATE_FUNCTIONS[self.function] and self.column is None:
            raise _error(f"{self.function} needs a column", "column")
        return self


class LateTable(_Model):
    """The late-data table of a gold stage."""

    table: Identifier = Field(description="Name of the table.")
    path: TableLocation | None = Field(
        default=None,
        description=(
            "Location of the table: a path (absolute, or relative to the runtime folder) or "
            "`s3a://bucket/prefix`; default: `<lake>/gold/<table>`."
        ),
    )


class ScheduledBackfill(_Model):
    """A backfill of a gold table's last closed event dates, run by a Dagster schedule."""

    schedule: Cron = Field(description="When it runs (cron, UTC), e.g. `30 2 * * *`.")
    dates: Annotated[StrictInt, Field(ge=1, le=366)] = Field(
        default=3,
        description="How many event dates: the newest dates the stream's watermark has closed.",
    )


class _GoldTable(SilverTable):
    """What every gold table declares: where it lives, its lateness and its late-data table."""

    model_config = ConfigDict(
        json_schema_extra=lambda schema: schema.update(
            required=[k for k in schema.get("required", []) if k != "late"]
        )
    )

    path: TableLocation | None = Field(
        default=None,
        description=(
            "Location of the table: a path (absolute, or relative to the runtime folder) or "
            "`s3a://bucket/prefix`; default: `<lake>/gold/<table>`."
        ),
    )
    description: StrictStr = Field(default="", description="What the table holds, for people.")
    allowed_lateness: Duration = Field(
        description="How far behind the newest event time an event may arrive and still count: "
        "the watermark is max(event time) - allowed_lateness; a row the stream can no longer "
        "take under it goes to the late-data table."
    )
    max_future_skew: Duration = Field(
        default="1 hour",
        description="An event time later than its ingestion time plus this is quarantined (it "
        "would push the watermark and make every other row late).",
    )
    late: LateTable = Field(
        description="Where late rows go; default table: `<table>_late`.",
    )
    partitions_start: date = Field(
        default=date(2025, 1, 1),
        description="The first event date of the gold table's daily partitions (backfills).",
    )
    backfill: ScheduledBackfill | None = Field(
        default=None,
        description="Re-materialize the last closed event dates by schedule, so late rows are "
        "reconciled without a person: the Dagster schedule `backfill_<table>_schedule`.",
    )

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        table = data.get("table")
        if data.get("late") is None and isinstance(table, str) and IDENTIFIER_RE.match(table):
            data["late"] = {"table": f"{table}_late"}
        return data

    @model_validator(mode="after")
    def _check_table(self) -> _GoldTable:
        if self.suite is not None:
            raise _error("Great Expectations suites of gold tables are not supported yet", "suite")
        if self.cluster_by:
            raise _error(
                "gold tables are partitioned by _event_date (backfills replace dates): use "
                "z_order_by",
                "cluster_by",
            )
        _raise_all(self._z_order_problems(), type(self).__name__)
        return self

    def _z_order_problems(self) -> Iterator[PydanticCustomError]:
        """``z_order_by`` names columns of the table, not its partition column (OPTIMIZE
        Z-orders the files within a partition)."""
        columns = self.table_columns()
        for column in self.z_order_by:
            if column == "_event_date":
                yield _error(
                    "'_event_date' partitions gold tables: OPTIMIZE Z-orders the files within "
                    "a partition, by other columns",
                    "z_order_by",
                )
            elif column not in columns:
                yield _error(
                    f"{column!r} is not a column of the gold table ({', '.join(columns)})",
                    "z_order_by",
                )

    def design_key(self) -> str:
        raise NotImplementedError

    def table_columns(self) -> tuple[str, ...]:
        """The gold table's columns, in order."""
        raise NotImplementedError

    def closing_delay_seconds(self) -> int:
        """How far past the end of an event date the watermark must be before the stream can
        change none of that date's gold rows again (a backfill of the date is then final)."""
        raise NotImplementedError


class GoldSpec(_GoldTable):
    """A gold table: windowed aggregates of the flow's silver events by event time, kept up to
    date by a stateful stream (RocksDB state), with late rows captured instead of dropped."""

    event_time: Identifier = Field(
        default="_event_time",
        description="The event-time column of the silver events (a TIMESTAMP); default: the "
        "events' `_event_time`.",
    )
    window: WindowSpec = Field(description="The event-time window of each aggregate row.")
    group_by: tuple[Identifier, ...] = Field(
        default=(), description="Group keys besides the window (columns of the silver events)."
    )
    aggregates: tuple[Aggregate, ...] = Field(
        min_length=1, description="The aggregate columns (a row count `_rows` is always kept)."
    )
    deduplicate: tuple[Identifier, ...] = Field(
        default=(),
        description="Drop an event whose values of these columns an earlier event of the "
        "watermark's span had (Spark's dropDuplicatesWithinWatermark); then a row is late when "
        "its event time is not above the watermark.",
    )

    @model_validator(mode="after")
    def _check_gold(self) -> GoldSpec:
        names = [a.name for a in self.aggregates]
        for column in (*self.group_by, *names):
            if column in GOLD_METADATA_COLUMNS:
                raise _error(f"{column!r} is a column gold keeps itself; choose another name")
        for index, name in enumerate(names):
            if name in names[:index] or name in self.group_by:
                raise _error(f"{name!r} is already a column of the table", f"aggregates.{index}")
        return self

    def closing_delay_seconds(self) -> int:
        return duration_seconds(self.window.duration)

    def design_key(self) -> str:
        """What the rows of the table depend on (table property ``conflux.gold.design``): a
        table built under another design refuses to continue, and refuses backfills."""
        window = f"{self.window.duration}/{self.window.slide or self.window.duration}"
        aggregates = ",".join(f"{a.name}={a.function}({a.column or ''})" for a in self.aggregates)
        return ";".join(
            (
                f"window={window}",
                f"eventTime={self.event_time}",
                f"lateness={self.allowed_lateness}",
                f"groupBy={','.join(self.group_by)}",
                f"dedup={','.join(self.deduplicate)}",
                f"aggregates={aggregates}",
            )
        )

    def input_columns(self) -> tuple[str, ...]:
        """The silver events' columns the stage reads (besides the event time)."""
        wanted = [
            *self.group_by,
            *(a.column for a in self.aggregates if a.column),
            *self.deduplicate,
        ]
        return tuple(dict.fromkeys(c for c in wanted if c is not None))

    def table_columns(self) -> tuple[str, ...]:
        return ("window_start", "window_end", *self.group_by, *(a.name for a in self.aggregates),
                "_rows", "_event_date", "_updated_at")  # fmt: skip


JOIN_SIDES = ("left", "right")


class JoinSide(_Model):
    """One input of a stream-stream join: rows of a flow's silver events."""

    event_time: Identifier = Field(
        default="_event_time",
        description="The side's event-time column (a TIMESTAMP); default: the events' "
        "`_event_time`.",
    )
    columns: tuple[Identifier, ...] = Field(
        default=(), description="Columns of the side's events the joined table keeps."
    )
    prefix: StrictStr = Field(
        default="",
        description="Put before the side's column names in the joined table (for two sides "
        "with a column of one name), e.g. `payment_`.",
    )
    where: StrictStr | None = Field(
        default=None,
        description="A Spark SQL condition on the side's events: only rows meeting it join "
        "(and count for its watermark).",
    )

    def output_names(self) -> tuple[str, ...]:
        return tuple(self.prefix + c for c in self.columns)


class RightSide(JoinSide):
    """The right input of a join: this flow's events or another flow's."""

    flow: Identifier | None = Field(
        default=None,
        description="The flow whose silver events are the right side (read as a Delta stream "
        "by this flow's Spark application); default: this flow.",
    )


class TimeBound(_Model):
    """How far apart in event time a left and a right row may be and still join."""

    before: Duration = Field(
        default="0 seconds",
        description="A right row may be this much earlier than the left row; default: 0.",
    )
    after: Duration = Field(description="A right row may be this much later than the left row.")


class JoinSpec(_Model):
    """A stream-stream join of this flow's events (left) with a flow's events (right)."""

    how: Literal["inner", "left_outer"] = Field(
        default="inner",
        description="inner: matched pairs only; left_outer: also every left row without a "
        "match, once the watermark passes its time bound (right columns null).",
    )
    keys: tuple[Identifier, ...] = Field(
        min_length=1,
        description="Key columns both sides have; rows join when all are equal (null never "
        "equals).",
    )
    left: JoinSide = Field(default=JoinSide(), description="This flow's events.")
    right: RightSide = Field(description="The other side's events.")
    within: TimeBound = Field(
        description="The time bound: right event time between left event time - `before` and "
        "left event time + `after` (it also bounds the join's state)."
    )

    def right_flow(self, flow: str) -> str:
        return self.right.flow or flow


class GoldJoinSpec(_GoldTable):
    """A gold table of a stream-stream join within a time bound, with watermarks on both sides;
    rows of either side that arrive behind the watermark are captured in the late-data table."""

    join: JoinSpec = Field(description="The join.")

    @model_validator(mode="after")
    def _check_join(self) -> GoldJoinSpec:
        keys = self.join.keys
        for index, key in enumerate(keys):
            if key in keys[:index]:
                raise _error(f"{key!r} is named twice", "join.keys")
        for name, side in (("left", self.join.left), ("right", self.join.right)):
            for column in side.columns:
                if side.prefix and side.prefix + column in keys:
                    raise _error(
                        f"{side.prefix + column!r} ({column!r} with the prefix) is a key column "
                        "of the table; choose another prefix",
                        f"join.{name}.prefix",
                    )
        seen: dict[str, str] = {}
        for name, where in (
            *((k, "join.keys") for k in self.join.keys),
            *((n, "join.left.columns") for n in self.join.left.output_names()),
            *((n, "join.right.columns") for n in self.join.right.output_names()),
        ):
            if name in JOIN_METADATA_COLUMNS:
                raise _error(f"{name!r} is a column the join keeps itself; choose another", where)
            if name in seen and where != "join.keys" and name not in self.join.keys:
                raise _error(
                    f"{name!r} is already a column of the table (from {seen[name]}): give the "
                    "side a `prefix`, or leave one of them out",
                    where,
                )
            seen.setdefault(name, where)
        return self

    def closing_delay_seconds(self) -> int:
        return duration_seconds(self.join.within.after)

    def design_key(self) -> str:
        """What the rows of the table depend on (see :meth:`GoldSpec.design_key`)."""
        join = self.join

        def side(s: JoinSide) -> str:
            return f"{s.event_time}:{','.join(s.columns)}:{s.prefix}:{s.where or ''}"

        return ";".join(
            (
                f"join={join.how}",
                f"keys={','.join(join.keys)}",
                f"within=-{join.within.before}/+{join.within.after}",
                f"lateness={self.allowed_lateness}",
                f"left={side(join.left)}",
                f"right={join.right.flow or ''}/{side(join.right)}",
            )
        )

    def side_columns(self, side: str) -> tuple[str, ...]:
        """The silver events' columns one side reads (besides its event time): keys first."""
        chosen = self.join.left if side == "left" else self.join.right
        return tuple(dict.fromkeys((*self.join.keys, *chosen.columns)))

    def table_columns(self) -> tuple[str, ...]:
        names = [*self.join.keys, *self.join.left.output_names(), *self.join.right.output_names()]
        return (*dict.fromkeys(names), *JOIN_METADATA_COLUMNS)


def _gold_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "join" if "join" in value else "aggregate"
    return "join" if isinstance(value, GoldJoinSpec) else "aggregate"


#: A gold table of a spec (for annotations).
AnyGold = GoldSpec | GoldJoinSpec
#: A gold table of a spec: windowed aggregates, or a stream-stream join (for validation).
GoldTable = Annotated[
    Annotated[GoldSpec, Tag("aggregate")] | Annotated[GoldJoinSpec, Tag("join")],
    Discriminator(_gold_kind),
]

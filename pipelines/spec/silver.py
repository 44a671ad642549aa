"""The silver part of a spec: parsing, the current-state and history tables, schema changes.

Columns are checked against the declared schema here (keys, kept and tracked columns, the columns
the ``sequence_by`` and ``delete_when`` expressions and the expectations name, suite and layout
columns), every problem at once, so a spec that loads names only columns its stage will have.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from .base import _error, _Model, _raise_all
from .columns import (
    CURRENT_METADATA_COLUMNS,
    EVENT_METADATA_COLUMNS,
    HISTORY_METADATA_COLUMNS,
    QUARANTINE_TABLE_COLUMNS,
    RESCUED_DATA_COLUMN,
    SEQUENCE_INPUT_METADATA,
)
from .ddl import SchemaDDL, _ddl_columns, _ddl_types
from .expectations import Expectation
from .references import reference_problem
from .table import SilverTable
from .values import Identifier, Retention, SqlFragment, TransformRef

SILVER_FORMATS = ("json", "debezium")
SILVER_CHAININGS = ("stream", "bronze_batch")

#: Default ``silver.current.sequence_by`` per format.
DEFAULT_SEQUENCE_BY = {"debezium": "_source_lsn", "json": "_source_offset"}
#: Metadata columns that are always null for a format: no sequence over them.
_NULL_METADATA = {"json": ("_source_ts_ms", "_source_lsn"), "debezium": ()}


class CurrentSpec(SilverTable):
    """The compacted current-state (SCD type 1) table: one live row per key."""

    keys: tuple[Identifier, ...] = Field(
        min_length=1, description="Key columns (at least one), columns of `silver.schema`."
    )
    sequence_by: SqlFragment | None = Field(
        default=None,
        description="Column or SQL expression ordering the changes of a key (the latest wins); "
        "default: `_source_lsn` for debezium, `_source_offset` for json.",
    )
    delete_when: SqlFragment | None = Field(
        default=None,
        description="SQL condition marking a json event as a delete of its key (format json "
        "only; debezium deletes are `op = 'd'`).",
    )
    ignore_null_updates: StrictBool = Field(
        default=False, description="Keep the current value of a column when an update carries null."
    )
    columns: tuple[Identifier, ...] = Field(
        default=(), description="Columns to keep (default: all); keys are always kept."
    )
    except_columns: tuple[Identifier, ...] = Field(
        default=(), description="Columns to leave out (not keys); not together with `columns`."
    )
    deleted_key_retention: Retention = Field(
        default="7 days",
        description="How long deleted keys are remembered (to drop late older changes), "
        "e.g. `7 days`.",
    )
    partition_by: tuple[Identifier, ...] = Field(
        default=(), description="Partition columns of the current table (columns it keeps)."
    )

    @model_validator(mode="after")
    def _check(self) -> CurrentSpec:
        if self.cluster_by and self.partition_by:
            raise _error("give cluster_by or partition_by, not both", "cluster_by")
        if self.columns and self.except_columns:
            raise _error("give columns or except_columns, not both", "except_columns")
        keys = [c for c in self.except_columns if c in self.keys]
        if keys:
            raise _error(
                f"may not name a key column ({', '.join(keys)}): keys are always kept",
                "except_columns",
            )
        return self

    def kept_columns(self, schema_columns: Iterable[str]) -> tuple[str, ...]:
        """The schema columns the current table keeps, in schema order (keys always)."""
        return tuple(
            c
            for c in schema_columns
            if c in self.keys
            or (c in self.columns if self.columns else c not in self.except_columns)
        )


class HistorySpec(SilverTable):
    """The history (SCD type 2) table: one row per version of a key, with its validity interval.

    A version is valid from the sequence of the change that opened it (``_valid_from``) until the
    sequence of the change that replaced or deleted it (``_valid_to``, null while it is the key's
    current version, when ``_is_current`` is true). Lakeflow's ``__START_AT`` / ``__END_AT`` are
    ``_valid_from`` / ``_valid_to``.
    """

    keys: tuple[Identifier, ...] = Field(
        default=(),
        description="Key columns, columns of `silver.schema`; default: `current.keys` "
        "(required without a current table).",
    )
    sequence_by: SqlFragment | None = Field(
        default=None,
        description="Column or SQL expression ordering the changes of a key; default: "
        "`current.sequence_by`, else the format's default (one sequence per silver stage).",
    )
    delete_when: SqlFragment | None = Field(
        default=None,
        description="SQL condition marking a json event as a delete (format json only); "
        "default: `current.delete_when` (one condition per silver stage).",
    )
    ignore_null_updates: StrictBool = Field(
        default=False,
        description="An update carrying null keeps the column's previous value in the version.",
    )
    track_history: tuple[Identifier, ...] = Field(
        default=(),
        description="Columns whose change opens a new version (default: every non-key column); "
        "a change of any other column updates the open version in place.",
    )
    track_history_except: tuple[Identifier, ...] = Field(
        default=(),
        description="Columns whose change does not open a new version; not together with "
        "`track_history`.",
    )

    @model_validator(mode="after")
    def _check(self) -> HistorySpec:
        if self.track_history and self.track_history_except:
            raise _error(
                "give track_history or track_history_except, not both", "track_history_except"
            )
        return self

    def tracked_columns(self, value_columns: Iterable[str]) -> tuple[str, ...]:
        """The value columns whose change opens a new version, in schema order."""
        return tuple(
            c
            for c in value_columns
            if (
                c in self.track_history
                if self.track_history
                else c not in self.track_history_except
            )
        )


class DebeziumEncoding(_Model):
    """How the connector encodes values, for records without Debezium's schema beside them.

    A record with its schema (``{"schema", "payload"}``, the JSON converter's
    ``schemas.enable=true``) names each column's encoding (``org.apache.kafka.connect.data.Decimal``
    with its scale, ``io.debezium.time.MicroTimestamp``, ...), and Conflux follows it; these
    settings apply to records without one and must then equal the connector's own."""

    decimal_handling_mode: Literal["precise", "string", "double"] = Field(
        default="precise",
        description="The connector's `decimal.handling.mode`: `precise` (base64 bytes of the "
        "unscaled value; `numeric` without a scale as `{scale, value}`), `string` or `double`.",
    )
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = Field(
        default="adaptive",
        description="The connector's `time.precision.mode`: with `adaptive` a `timestamp` column "
        "arrives as epoch microseconds (PostgreSQL's default precision, 6; declare `connect` for "
        "epoch milliseconds), a `date` as epoch days; `timestamptz` is an ISO 8601 string always.",
    )
    binary_handling_mode: Literal["bytes", "base64", "hex"] = Field(
        default="bytes",
        description="The connector's `binary.handling.mode` for BINARY columns: `bytes` and "
        "`base64` arrive base64-encoded, `hex` as hexadecimal text.",
    )

    truncate: Literal["quarantine", "apply"] = Field(
        default="quarantine",
        description="A TRUNCATE of the table (op `t`; the connector sends them only with "
        "`skipped.operations` not listing `t`): `apply` deletes every current row older than it "
        "and closes every open history version at it; `quarantine` keeps the record in the "
        "quarantine with the reason.",
    )


class SchemaChangePolicy(_Model):
    """What the silver stage does when the records stop matching the declared schema.

    A record is compared with the schema on its top-level fields (for Debezium: the fields of the
    ``after`` image of a create, update or snapshot read). Additive changes are safe to take in;
    non-additive ones (a value of another type, a declared column missing: dropped or renamed
    upstream) would change what a column means, so the affected records go to the quarantine
    with the change named (and the ``schema_changes`` Dagster check warns) unless ``fail`` is
    asked for, while the stream goes on.
    """

    new_columns: Literal["evolve", "rescue", "quarantine", "ignore", "fail"] = Field(
        default="evolve",
        description="An undeclared field: `evolve` adds it as a nullable column to the silver "
        "tables (type inferred from the batch: BIGINT, DOUBLE, BOOLEAN, else STRING holding its "
        "JSON) and writes the batch with it; `rescue` keeps undeclared fields as a JSON object in "
        "the `_rescued_data` column; `quarantine` sends the record to the quarantine; `ignore` "
        "drops the fields (bronze keeps the record); `fail` stops the flow before the batch is "
        "written. Declare the schema's subset of a wide payload with `ignore`.",
    )
    missing_columns: Literal["allow", "quarantine", "fail"] | None = Field(
        default=None,
        description="A declared column absent from the record (not null: absent): `allow` reads "
        "it as null, `quarantine` sends the record to the quarantine (a column dropped or renamed "
        "upstream), `fail` stops the flow. Default: `quarantine` for debezium (its row images "
        "carry every column), `allow` for json (optional fields are usually left out).",
    )
    max_new_columns: int = Field(
        default=100,
        gt=0,
        description="`evolve` only: at most this many columns evolved into the tables in all; "
        "a batch that would pass it stops the flow (field names that keep changing are data, "
        "not columns: rescue or ignore them).",
    )
    type_changes: Literal["quarantine", "fail"] = Field(
        default="quarantine",
        description="A value of another type than declared: `quarantine` the record with the "
        "columns named (the stream goes on), or `fail` the flow before the batch is written.",
    )


class SilverSpec(_Model):
    """Parse the bronze Kafka payloads into typed silver tables."""

    model_config = ConfigDict(
        json_schema_extra=lambda schema: schema.update(
            required=[k for k in schema.get("required", []) if k not in ("events", "quarantine")]
        )
    )

    format: Literal["json", "debezium"] = Field(
        description="Payload format: `json` (one JSON object per record, the row itself) or "
        "`debezium` (Debezium change events, JSON with or without the schema envelope)."
    )
    schema_ddl: SchemaDDL = Field(
        validation_alias="schema",
        serialization_alias="schema",
        description="Columns of the parsed row: a Spark DDL string "
        "(`id BIGINT, name STRING`) or a mapping of column to type (`{id: bigint}`).",
    )
    event_time: Identifier | None = Field(
        default=None,
        description="Column of the schema holding the event time; default: Debezium's "
        "`source.ts_ms` (debezium) or the Kafka timestamp (json).",
    )
    chaining: Literal["stream", "bronze_batch"] = Field(
        default="stream",
        description="`stream`: a query of its own reads the bronze table (own checkpoint); "
        "`bronze_batch`: silver is written within bronze's micro-batch.",
    )
    max_files_per_trigger: int | None = Field(
        default=None,
        gt=0,
        description="`chaining: stream` only: at most this many bronze files per silver "
        "micro-batch (Delta's `maxFilesPerTrigger`; default 1000), so a rebuild from a large "
        "bronze table runs in bounded batches.",
    )
    events: SilverTable = Field(
        description="The append-only table of parsed events; default table: `silver_<flow>_events`."
    )
    quarantine: SilverTable = Field(
        description="Records that fail to parse, with the reasons; default table: "
        "`silver_<flow>_quarantine`."
    )
    current: CurrentSpec | None = Field(
        default=None, description="The compacted current-state table (optional)."
    )
    history: HistorySpec | None = Field(
        default=None, description="The history (SCD type 2) table of every key (optional)."
    )
    transform: TransformRef | None = Field(
        default=None,
        description="A Python function `package.module:function` (DataFrame -> DataFrame) "
        "applied to each batch's parsed events before any table is written; it may add columns, "
        "filter and rewrite rows, but must keep the key, sequence and `_`-metadata columns.",
    )
    expectations: tuple[Expectation, ...] = Field(
        default=(),
        description="Row expectations evaluated on every parsed row (before the transform), "
        "all in one pass over the micro-batch; each `warn`s, `drop`s the row to the quarantine "
        "or `fail`s the flow.",
    )

    debezium: DebeziumEncoding = Field(
        default_factory=DebeziumEncoding,
        description="`format: debezium`: the connector's value encodings, for records that do "
        "not carry Debezium's schema (those that do are decoded by it).",
    )
    schema_changes: SchemaChangePolicy = Field(
        default_factory=SchemaChangePolicy,
        description="What records that no longer match the schema do: new fields evolve the "
        "tables (or are rescued, quarantined, ignored); changed types and missing columns are "
        "quarantined with a warning check, or fail the flow.",
    )

    def columns(self) -> tuple[str, ...]:
        """Column names of the parsed row, in order: :attr:`schema_ddl`'s, then
        :data:`RESCUED_DATA_COLUMN` when undeclared fields are rescued."""
        rescued = (RESCUED_DATA_COLUMN,) if self.schema_changes.new_columns == "rescue" else ()
        return (*_ddl_columns(self.schema_ddl), *rescued)

    def declared_columns(self) -> tuple[str, ...]:
        """Column names of :attr:`schema_ddl`: the fields a record is parsed into."""
        return _ddl_columns(self.schema_ddl)

    @property
    def missing_columns(self) -> str:
        """``schema_changes.missing_columns``, or the format's default."""
        declared = self.schema_changes.missing_columns
        if declared is not None:
            return declared
        return "quarantine" if self.format == "debezium" else "allow"

    @property
    def own_query(self) -> bool:
        """Whether silver runs as a streaming query of its own over the bronze table, with its own
        checkpoint (``chaining: stream``), rather than inside bronze's batches."""
        return self.chaining == "stream"

    @property
    def sequence_expression(self) -> str:
        """``current.sequence_by`` or ``history.sequence_by``, or the format's default
        (:data:`DEFAULT_SEQUENCE_BY`)."""
        for table in (self.current, self.history):
            if table is not None and table.sequence_by:
                return table.sequence_by
        return DEFAULT_SEQUENCE_BY[self.format]

    @property
    def delete_condition(self) -> str | None:
        """``current.delete_when`` or ``history.delete_when`` (json only)."""
        for table in (self.current, self.history):
            if table is not None and table.delete_when:
                return table.delete_when
        return None

    @property
    def history_keys(self) -> tuple[str, ...]:
        """The history table's keys: its own, else the current table's."""
        assert self.history is not None
        if self.history.keys:
            return self.history.keys
        assert self.current is not None, "validated: history without current names its keys"
        return self.current.keys

    @model_validator(mode="after")
    def _check(self) -> SilverSpec:
        """Every column the section names is one its stage will have (every problem at once)."""
        columns = self.columns()
        _raise_all(
            (
                *self._event_time_problems(),
                *self._current_problems(columns),
                *self._history_problems(columns),
                *self._expectation_problems(columns),
                *self._table_problems(columns),
            ),
            type(self).__name__,
        )
        return self

    def _known(self, columns: tuple[str, ...]) -> str:
        return f"columns of schema: {', '.join(columns)}"

    def _event_time_problems(self) -> Iterator[PydanticCustomError]:
        if self.event_time is None:
            return
        if self.event_time not in self.declared_columns():
            known = self._known(self.columns())
            yield _error(f"{self.event_time!r} is not a column of schema ({known})", "event_time")
            return
        kind = _ddl_types(self.schema_ddl)[self.event_time]
        if not kind.startswith(("timestamp", "date")):
            yield _error(
                f"{self.event_time!r} is {kind}; the event time must be a TIMESTAMP or DATE "
                "column (declare epoch values as TIMESTAMP in the schema, or leave event_time "
                "out to use the source's time)",
                "event_time",
            )

    def _current_problems(self, columns: tuple[str, ...]) -> Iterator[PydanticCustomError]:
        current = self.current
        if current is None:
            return
        for name in ("keys", "columns", "except_columns"):
            for column in getattr(current, name):
                if column not in columns:
                    yield _error(
                        f"{column!r} is not a column of schema ({self._known(columns)})",
                        f"current.{name}",
                    )
        kept = current.kept_columns(columns)
        for column in current.partition_by:
            if column not in kept:
                yield _error(
                    f"{column!r} is not a column of the current table ({', '.join(kept)})",
                    "current.partition_by",
                )
        yield from self._expression_problems(current, "current")

    def _history_problems(self, columns: tuple[str, ...]) -> Iterator[PydanticCustomError]:
        history, current = self.history, self.current
        if history is None:
            return
        if not history.keys and current is None:
            yield _error("is required without a current table", "history.keys")
            return
        keys = self.history_keys
        for name, names in (
            ("keys", history.keys),
            ("track_history", history.track_history),
            ("track_history_except", history.track_history_except),
        ):
            for column in names:
                if column not in columns:
                    yield _error(
                        f"{column!r} is not a column of schema ({self._known(columns)})",
                        f"history.{name}",
                    )
        for name in ("track_history", "track_history_except"):
            named_keys = [c for c in getattr(history, name) if c in keys]
            if named_keys:
                yield _error(
                    f"may not name a key column ({', '.join(named_keys)}): a key identifies "
                    "the versions",
                    f"history.{name}",
                )
        for name in ("sequence_by", "delete_when"):
            mine, theirs = getattr(history, name), getattr(current, name, None)
            if mine is not None and theirs is not None and mine != theirs:
                yield _error(
                    f"{mine!r} differs from current.{name} {theirs!r}: the tables of one silver "
                    f"stage share one {name}; leave history.{name} out",
                    f"history.{name}",
                )
        yield from self._expression_problems(history, "history")

    def _expression_problems(
        self, table: CurrentSpec | HistorySpec, field: str
    ) -> Iterator[PydanticCustomError]:
        """``sequence_by`` and ``delete_when`` of ``table`` name columns the parsed row has when
        they are computed: the declared ones and :data:`SEQUENCE_INPUT_METADATA` (a sequence not
        the format's always-null ones). The history table's, when the current table's is the
        same, is the current table's problem."""
        null = _NULL_METADATA[self.format]
        for name, expression, skipped in (
            ("sequence_by", table.sequence_by, null),
            ("delete_when", table.delete_when, ()),
        ):
            shared = field == "history" and expression == getattr(self.current, name, None)
            if expression is None or shared:
                continue
            if name == "delete_when" and self.format != "json":
                yield _error(
                    "only with format json (debezium deletes are the events with op = 'd')",
                    f"{field}.delete_when",
                )
                continue
            note = f"; {' and '.join(null)} are null in format {self.format}" if skipped else ""
            problem = reference_problem(
                expression,
                self.declared_columns(),
                [c for c in SEQUENCE_INPUT_METADATA if c not in skipped],
                note=note,
            )
            if problem is not None:
                yield _error(problem, f"{field}.{name}")

    def _table_columns(self, columns: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """The columns of each silver table, by spec field (before any transform)."""
        tables = {
            "events": (*columns, *EVENT_METADATA_COLUMNS),
            "quarantine": QUARANTINE_TABLE_COLUMNS,
        }
        if self.current is not None:
            tables["current"] = (*self.current.kept_columns(columns), *CURRENT_METADATA_COLUMNS)
        if self.history is not None:
            tables["history"] = (*columns, *HISTORY_METADATA_COLUMNS)
        return tables

    def _table_problems(self, columns: tuple[str, ...]) -> Iterator[PydanticCustomError]:
        """The columns of each table's suite, ``z_order_by`` and ``cluster_by`` are the table's
        (unknown until start for a table a transform writes: it may add columns); OPTIMIZE cannot
        Z-order by a partition column."""
        partitions = {
            "events": ("_event_date",),
            "current": getattr(self.current, "partition_by", ()),
        }
        for field, table_columns in self._table_columns(columns).items():
            if self.transform is not None and field != "quarantine":
                continue
            table: SilverTable = getattr(self, field)
            named = [
                ("suite", table.suite.columns() if table.suite else []),
                ("z_order_by", table.z_order_by),
                ("cluster_by", table.cluster_by),
            ]
            for name, names in named:
                for column in names:
                    if column not in table_columns:
                        yield _error(
                            f"{column!r} is not a column of the {field} table "
                            f"({', '.join(table_columns)})",
                            f"{field}.{name}",
                        )
                    elif name == "z_order_by" and column in partitions.get(field, ()):
                        yield _error(
                            f"{column!r} is a partition column of the {field} table: OPTIMIZE "
                            "Z-orders the files within a partition, by other columns",
                            f"{field}.z_order_by",
                        )

    def _expectation_problems(self, columns: tuple[str, ...]) -> Iterator[PydanticCustomError]:
        """Expectations have distinct names, and name columns of the parsed row: the schema's
        and :data:`EVENT_METADATA_COLUMNS` (they are judged before the transform)."""
        known = self._known(columns)
        seen: set[str] = set()
        for index, expectation in enumerate(self.expectations):
            if expectation.name in seen:
                yield _error(
                    f"{expectation.name!r} is the name of an earlier expectation; give each its own",
                    f"expectations.{index}.name",
                )
            seen.add(expectation.name)
            for column in expectation.columns():
                if column not in columns and column not in EVENT_METADATA_COLUMNS:
                    yield _error(
                        f"{column!r} is neither a column of schema ({known}) nor a metadata "
                        f"column ({', '.join(EVENT_METADATA_COLUMNS)})",
                        f"expectations.{index}.args.column",
                    )
            if expectation.expr is not None:
                problem = reference_problem(expectation.expr, columns, EVENT_METADATA_COLUMNS)
                if problem is not None:
                    yield _error(problem, f"expectations.{index}.expr")

"""Flow specs: one YAML file declares a flow from a source into a bronze Delta table, and
optionally on into silver (parsed events, a quarantine, a compacted current-state table).

A spec is parsed into frozen pydantic models and validated up front; every error names the file
and the field (``flows/orders.yaml: source.topics: ...``), one error (the first) per
:class:`SpecError`. Identifiers are checked against :data:`IDENTIFIER_RE`, so nothing
user-written is pasted into SQL unchecked (except the SQL expressions a silver section declares
as such: ``current.sequence_by`` and ``current.delete_when``). ``conflux schema`` prints the
spec's JSON Schema (checked in as ``flows/flow.schema.json`` for editors).

Example::

    name: orders
    source:
      kind: kafka
      topics: [orders]
      starting_offsets: earliest
      max_offsets_per_trigger: 50000
    target:
      table: bronze_orders
      partition_by: [ingest_date]
    trigger:
      mode: available_now        # or: continuous, with interval: "5 seconds"
    silver:                      # optional
      format: json               # or: debezium
      schema: "id BIGINT, amount DOUBLE, updated_at TIMESTAMP"
      current: {table: orders, keys: [id]}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import ErrorDetails, PydanticCustomError

from pipelines.errors import ConfigError

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
INTERVAL_RE = re.compile(r"^\d+(\.\d+)?\s*(millisecond|second|minute|hour)s?$")
#: ``silver.current.deleted_key_retention``: like a trigger interval, in whole units, days allowed.
RETENTION_RE = re.compile(r"^\d+\s*(second|minute|hour|day)s?$")
#: ``silver.transform``: ``package.module:function``.
TRANSFORM_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
#: ``maintenance.schedule``: a five-field cron expression.
CRON_RE = re.compile(r"^\s*(\S+\s+){4}\S+\s*$")
FILE_FORMATS = ("json", "csv", "parquet")
TRIGGER_MODES = ("available_now", "continuous")
SILVER_FORMATS = ("json", "debezium")
SILVER_CHAININGS = ("stream", "bronze_batch")
#: Folders beside the bronze checkpoint (``<checkpoints>/<flow>/<bronze table>``): stage checkpoints.
RESERVED_CHECKPOINT_NAMES = ("silver", "gold")
#: Columns bronze adds itself; a user partition column may use ``ingest_date`` too.
BRONZE_PARTITION_COLUMNS = ("ingest_date", "topic")
#: Columns silver adds to the events table after the schema's columns (``_sequence`` is computed
#: from the sequence expression, so it cannot be one of its inputs).
EVENT_METADATA_COLUMNS = (
    "_op", "_sequence", "_event_time", "_event_date", "_source_topic", "_source_partition",
    "_source_offset", "_source_timestamp", "_source_ts_ms", "_source_lsn", "_ingested_at",
    "_batch_id",
)  # fmt: skip
#: Columns silver adds to the current table and its deleted-keys side table.
CURRENT_METADATA_COLUMNS = ("_sequence", "_op", "_event_time", "_updated_at", "_deleted_at")
#: Columns silver adds to the history table after its keys and values.
HISTORY_METADATA_COLUMNS = (
    "_valid_from", "_valid_to", "_valid_from_time", "_valid_to_time", "_is_current", "_updated_at",
)  # fmt: skip
#: The quarantine table's columns.
QUARANTINE_TABLE_COLUMNS = (
    "flow", "batch_id", "topic", "partition", "offset", "kafka_timestamp", "raw_key", "raw_value",
    "reasons", "quarantined_at",
)  # fmt: skip
#: The column of every silver table that keeps a record's undeclared fields under
#: ``silver.schema_changes.new_columns: rescue``.
RESCUED_DATA_COLUMN = "_rescued_data"
#: Default ``silver.current.sequence_by`` per format.
DEFAULT_SEQUENCE_BY = {"debezium": "_source_lsn", "json": "_source_offset"}
#: Metadata columns that are always null for a format: no sequence over them.
_NULL_METADATA = {"json": ("_source_ts_ms", "_source_lsn"), "debezium": ()}


class SpecError(ConfigError):
    """A flow spec is invalid; the message names the file and the field."""


# --- validation helpers --------------------------------------------------------------------------


def _error(message: str, field: str = "") -> PydanticCustomError:
    """A validation error carrying our own wording; ``field`` is relative to the failing model."""
    return PydanticCustomError("conflux_spec", "{message}", {"message": message, "field": field})


def _identifier(value: str) -> str:
    if not IDENTIFIER_RE.match(value):
        raise _error(f"{value!r} is not a valid identifier (letters, digits, _)")
    return value


def _topic(value: str) -> str:
    if not TOPIC_RE.match(value):
        raise _error(f"{value!r} is not a valid Kafka topic name")
    return value


def _interval(value: str) -> str:
    if not INTERVAL_RE.match(value):
        raise _error(f"{value!r} is not an interval such as '5 seconds'")
    return value


def _retention(value: str) -> str:
    if not RETENTION_RE.match(value):
        raise _error(f"{value!r} is not a retention such as '7 days' (seconds to days)")
    return value


def _local_path(value: str) -> str:
    """Paths are local or on a mounted shared filesystem for now: the lease, identity and stop
    files beside a flow's checkpoint need one. Refuse a URI instead of misreading it."""
    if "://" in value:
        raise _error(
            f"{value!r} is a URI; Conflux reads and writes local or mounted paths only so far "
            "(mount the bucket, e.g. with a FUSE or NFS gateway, and give its path)"
        )
    return value


def _transform(value: str) -> str:
    if not TRANSFORM_RE.match(value):
        raise _error(
            f"{value!r} is not a function reference; give `package.module:function`, "
            "e.g. `transforms.customers:mask_emails`"
        )
    return value


def _cron(value: str) -> str:
    if not CRON_RE.match(value):
        raise _error(f"{value!r} is not a cron expression of five fields, e.g. `0 3 * * *`")
    return value


def _sql_fragment(value: str) -> str:
    if not value.strip():
        raise _error("is empty; give a column or a SQL expression, or leave the field out")
    if ";" in value:
        raise _error(f"{value!r} contains ';': give one SQL expression, not statements")
    return value


def _string_map(value: Any) -> Any:
    """YAML option values may be numbers or booleans: Spark options are strings."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return value


def _string(pattern: re.Pattern[str] | None = None, **extra: Any) -> WithJsonSchema:
    schema: dict[str, Any] = {"type": "string", **extra}
    if pattern is not None:
        schema["pattern"] = pattern.pattern
    return WithJsonSchema(schema)


Identifier = Annotated[StrictStr, AfterValidator(_identifier), _string(IDENTIFIER_RE)]
Topic = Annotated[StrictStr, AfterValidator(_topic), _string(TOPIC_RE)]
Interval = Annotated[StrictStr, AfterValidator(_interval), _string(INTERVAL_RE)]
Retention = Annotated[StrictStr, AfterValidator(_retention), _string(RETENTION_RE)]
LocalPath = Annotated[StrictStr, AfterValidator(_local_path), _string()]
TransformRef = Annotated[StrictStr, AfterValidator(_transform), _string(TRANSFORM_RE)]
Cron = Annotated[StrictStr, AfterValidator(_cron), _string(CRON_RE)]
SqlFragment = Annotated[StrictStr, AfterValidator(_sql_fragment), _string(minLength=1)]
DURATION_RE = RETENTION_RE
_DURATION_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def duration_seconds(text: str) -> int:
    """Seconds in a spec duration such as ``10 minutes`` (validated by :data:`DURATION_RE`)."""
    match = re.match(r"^(\d+)\s*(second|minute|hour|day)s?$", text)
    assert match is not None, f"not a duration: {text!r}"
    return int(match[1]) * _DURATION_UNITS[match[2]]


def _duration(value: str) -> str:
    if not DURATION_RE.match(value):
        raise _error(f"{value!r} is not a duration such as '10 minutes' (seconds to days)")
    return value


Duration = Annotated[StrictStr, AfterValidator(_duration), _string(DURATION_RE)]


OWNER_RE = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")
TAG_RE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


def _owner(value: str) -> str:
    if not OWNER_RE.match(value):
        raise _error(f"{value!r} is neither an email nor `team:<name>`")
    return value


def _tags(value: dict[str, str]) -> dict[str, str]:
    for key, tag in value.items():
        if not key or not TAG_RE.match(key) or not TAG_RE.match(tag):
            raise _error(
                f"tag {key!r}: {tag!r} is not a Dagster tag: keys and values of letters, "
                "digits, `_`, `-`, `.`, at most 63 characters (keys not empty)"
            )
    return value


Owner = Annotated[StrictStr, AfterValidator(_owner), _string(OWNER_RE)]
StringMap = Annotated[
    dict[str, str],
    BeforeValidator(_string_map),
    WithJsonSchema(
        {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
    ),
]
TagMap = Annotated[StringMap, AfterValidator(_tags)]


class _Model(BaseModel):
    """Frozen; unknown YAML keys are refused with the allowed ones; ``key: null`` is absent."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        validate_default=False,
    )
    #: Fields that are not YAML keys (set by the loader).
    _internal_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def yaml_keys(cls) -> list[str]:
        """The keys a YAML mapping may use for this model, in declaration order."""
        return [
            field.validation_alias if isinstance(field.validation_alias, str) else name
            for name, field in cls.model_fields.items()
            if name not in cls._internal_fields
        ]

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        keys = cls.yaml_keys()
        from_yaml = bool(info.context and info.context.get("yaml"))
        allowed = set(keys) if from_yaml else set(keys) | set(cls.model_fields)
        unknown = sorted(str(key) for key in data if key not in allowed)
        if unknown:
            raise _error(f"unknown field; allowed: {', '.join(keys)}", unknown[0])
        return cls._prepare({k: v for k, v in data.items() if v is not None}, info)

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Hook: fill in what a model derives from its input before validation."""
        return data


def _require_kind(schema: dict[str, Any]) -> None:
    """``kind`` has a default for Python callers, but a YAML source must name its kind."""
    schema["required"] = ["kind", *[k for k in schema.get("required", []) if k != "kind"]]


# --- bronze: source, target, trigger --------------------------------------------------------------


class KafkaSource(_Model):
    """Read one or several Kafka topics (a list, or a subscribe pattern)."""

    model_config = ConfigDict(json_schema_extra=_require_kind)

    kind: Literal["kafka"] = Field(default="kafka", description="The kind of source: `kafka`.")
    topics: tuple[Topic, ...] = Field(
        default=(), description="Topics to read; give exactly one of `topics` or `pattern`."
    )
    pattern: StrictStr | None = Field(
        default=None, description="A Java regex of topics to subscribe to, instead of `topics`."
    )
    starting_offsets: Literal["earliest", "latest", "timestamp"] = Field(
        default="earliest",
        description="Where a new flow (no checkpoint yet) starts reading: `earliest`, `latest`, "
        "or `timestamp` (then give `starting_timestamp_ms`).",
    )
    starting_timestamp_ms: StrictInt | None = Field(
        default=None,
        description="Epoch milliseconds to start from; required exactly when "
        "`starting_offsets` is `timestamp`.",
    )
    max_offsets_per_trigger: StrictInt | None = Field(
        default=None, gt=0, description="Upper bound of records per micro-batch (all partitions)."
    )
    fail_on_data_loss: StrictBool = Field(
        default=True,
        description="Fail when offsets the checkpoint expects are gone (retention, topic "
        "recreated) instead of skipping them.",
    )
    bootstrap_servers: StrictStr | None = Field(
        default=None,
        description="Kafka bootstrap servers; default: the settings' bootstrap servers.",
    )
    options: StringMap = Field(
        default_factory=dict,
        description="Kafka client options passed through to Spark; only `kafka.*` keys.",
    )

    @field_validator("options")
    @classmethod
    def _kafka_options_only(cls, options: dict[str, str]) -> dict[str, str]:
        bad = [k for k in options if not k.startswith("kafka.")]
        if bad:
            raise _error(f"only kafka.* client options pass through, not {bad}")
        return options

    @model_validator(mode="after")
    def _check(self) -> KafkaSource:
        if bool(self.topics) == bool(self.pattern):
            raise _error("give exactly one of topics (a non-empty list) or pattern", "topics")
        if (self.starting_offsets == "timestamp") != (self.starting_timestamp_ms is not None):
            raise _error(
                "is required exactly when starting_offsets is timestamp", "starting_timestamp_ms"
            )
        return self


class FileSource(_Model):
    """Read files that land in a folder (JSON lines, CSV with a header, or Parquet)."""

    model_config = ConfigDict(json_schema_extra=_require_kind)

    kind: Literal["files"] = Field(default="files", description="The kind of source: `files`.")
    path: LocalPath = Field(
        description="The landing folder: absolute, or relative to the runtime folder."
    )
    format: Literal["json", "csv", "parquet"] = Field(
        default="json",
        description="File format: `json` (JSON lines), `csv` (with a header), `parquet`.",
    )
    max_files_per_trigger: StrictInt | None = Field(
        default=None, gt=0, description="Upper bound of files per micro-batch."
    )
    archive_dir: StrictStr | None = Field(
        default=None,
        description="Move processed files into this folder (outside the landing folder).",
    )
    options: StringMap = Field(
        default_factory=dict,
        description="Spark reader options of the format (e.g. `sep` for CSV).",
    )


Source = KafkaSource | FileSource
#: The ``kind`` of each source model, e.g. ``("kafka", "files")``.
SOURCE_KINDS: tuple[str, ...] = tuple(
    str(model.model_fields["kind"].default) for model in get_args(Source)
)


class Target(_Model):
    """The bronze Delta table a flow writes."""

    table: Identifier = Field(description="Name of the bronze table.")
    path: LocalPath | None = Field(
        default=None, description="Location of the table; default: `<lake>/bronze/<table>`."
    )
    partition_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Partition columns, among: " + ", ".join(BRONZE_PARTITION_COLUMNS) + ".",
    )

    @field_validator("table")
    @classmethod
    def _not_a_stage_folder(cls, table: str) -> str:
        if table in RESERVED_CHECKPOINT_NAMES:
            raise _error(
                f"{table!r} is the name of a folder of the flow's checkpoints (the bronze "
                "checkpoint is named after the table): choose another name"
            )
        return table

    @field_validator("partition_by")
    @classmethod
    def _bronze_columns(cls, columns: tuple[str, ...]) -> tuple[str, ...]:
        for column in columns:
            if column not in BRONZE_PARTITION_COLUMNS:
                raise _error(
                    f"bronze can be partitioned by {', '.join(BRONZE_PARTITION_COLUMNS)}, "
                    f"not {column!r}"
                )
        return columns


class Trigger(_Model):
    """When micro-batches run."""

    mode: Literal["available_now", "continuous"] = Field(
        default="available_now",
        description="`available_now`: read what is there, then stop (incremental runs); "
        "`continuous`: run until stopped, one micro-batch per `interval`.",
    )
    interval: Interval = Field(
        default="5 seconds",
        description="Micro-batch interval of a continuous flow, e.g. `5 seconds`.",
    )
    schedule: Cron | None = Field(
        default=None,
        description="When an `available_now` flow runs by itself (cron, UTC), e.g. `*/15 * * * *`: "
        "the Dagster schedule `run_<flow>_schedule`; default: only when launched.",
    )
    stale_after: Duration = Field(
        default="2 minutes",
        description="A continuous flow whose Spark application has reported nothing (no batch, "
        "no idle heartbeat) for this long is unhealthy (its `stream_health` check fails). "
        "Spark reports an idle query every 10 seconds, so keep it well above that.",
    )
    max_restarts: Annotated[StrictInt, Field(ge=0)] = Field(
        default=5,
        description="A continuous flow whose Spark application dies is started again, from its "
        "checkpoint, up to this many times per run (0: never).",
    )
    restart_delay: Duration = Field(
        default="10 seconds",
        description="Wait before the first restart; Dagster's exponential backoff waits 1, 3, 7, "
        "... times this before each further one.",
    )

    @model_validator(mode="after")
    def _check_schedule(self) -> Trigger:
        if self.schedule is not None and self.mode == "continuous":
            raise _error(
                "a continuous flow runs until stopped: a schedule starts `available_now` runs; "
                "set `mode: available_now` or leave `schedule` out",
                "schedule",
            )
        least = max(30.0, 2 * self.interval_seconds() + 10)
        if duration_seconds(self.stale_after) < least:
            raise _error(
                f"{self.stale_after!r} is shorter than {least:.0f} seconds: an idle query reports "
                f"once per trigger (interval {self.interval}) and at most every 10 seconds, so a "
                "healthy idle flow would look stale; give at least twice the interval plus 10 "
                "seconds, and more than your longest micro-batch",
                "stale_after",
            )
        return self

    def interval_seconds(self) -> float:
        """Seconds in :attr:`interval` (validated by :data:`INTERVAL_RE`)."""
        match = re.match(r"^(\d+(?:\.\d+)?)\s*(millisecond|second|minute|hour)s?$", self.interval)
        assert match is not None, self.interval
        unit = {"millisecond": 0.001, "second": 1, "minute": 60, "hour": 3600}[match[2]]
        return float(match[1]) * unit


# --- silver ---------------------------------------------------------------------------------------


def _split_ddl(ddl: str) -> list[str]:
    """Column definitions of a DDL string: split on commas outside <>, () and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in ddl:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return parts


def _name_and_type(part: str) -> tuple[str, str]:
    """``"`from` STRING"`` -> ``("from", "STRING")``: one column definition of a DDL string."""
    if part.startswith("`"):
        end = part.find("`", 1)
        return (part[1:end], part[end + 1 :].strip()) if end > 0 else (part, "")
    name, _, rest = part.partition(" ")
    return name, rest.strip()


def _ddl_columns(ddl: str) -> tuple[str, ...]:
    """Column names of a DDL string such as ``"id BIGINT, `from` STRING"``, checked."""
    names: list[str] = []
    for part in _split_ddl(ddl):
        if not part:
            raise _error(f"an empty column definition in {ddl!r} (a stray comma?)")
        name, rest = _name_and_type(part)
        if not IDENTIFIER_RE.match(name):
            raise _error(f"column {name!r} is not a valid identifier (letters, digits, _)")
        if not rest.strip():
            raise _error(f"column {name!r} has no type (e.g. '{name} STRING')")
        if name.lower() in (n.lower() for n in names):
            raise _error(f"column {name!r} appears twice")
        if (
            name in EVENT_METADATA_COLUMNS
            or name in CURRENT_METADATA_COLUMNS
            or name == RESCUED_DATA_COLUMN
        ):
            raise _error(f"column {name!r} clashes with a column silver adds; rename it")
        names.append(name)
    return tuple(names)


def ddl_fields(ddl: str) -> list[tuple[str, str]]:
    """(name, type as written) of each column of a DDL string, without Spark."""
    return [_name_and_type(part) for part in _split_ddl(ddl) if part]


def _ddl_types(ddl: str) -> dict[str, str]:
    """Column name -> its type as written (lower case), of a DDL string already checked."""
    return {name: kind.lower() for name, kind in ddl_fields(ddl)}


def _schema_ddl(value: Any) -> Any:
    """``{id: bigint, name: string}`` is the DDL string ``"id bigint, name string"``."""
    if not isinstance(value, dict):
        return value
    if not value:
        raise _error("is empty; give the payload's columns and their types")
    columns = []
    for name, kind in value.items():
        if not isinstance(kind, str) or not kind.strip():
            raise _error(f"column {name!r}: expected a type string, got {type(kind).__name__}")
        columns.append(f"{name} {kind.strip()}")
    return ", ".join(columns)


def _check_ddl(value: str) -> str:
    if not value.strip():
        raise _error("is empty; give the payload's columns and their types")
    _ddl_columns(value)
    return value


SchemaDDL = Annotated[
    StrictStr,
    BeforeValidator(_schema_ddl),
    AfterValidator(_check_ddl),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
            ]
        }
    ),
]


#: Table properties a spec field of its own sets (``properties`` may not set them too).
FEATURE_PROPERTIES = {
    "delta.enableChangeDataFeed": "change_data_feed",
    "delta.enableDeletionVectors": "deletion_vectors",
    "delta.columnMapping.mode": "column_mapping",
}
#: Properties whose shortening could let a replayed batch be written twice, or a stream lose files.
_GUARDED_PROPERTIES = ("delta.setTransactionRetentionDuration", "delta.logRetentionDuration")


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


class SilverTable(_Model):
    """A silver table: its name, optionally its location, and the Delta features it uses.

    Features left out get the role's default (see each table); a feature switched on later is
    switched on at the next start (``ALTER TABLE ... SET TBLPROPERTIES``); switching deletion
    vectors or column mapping off again is Delta's to refuse.
    """

    table: Identifier = Field(description="Name of the table.")
    path: LocalPath | None = Field(
        default=None, description="Location of the table; default: `<lake>/silver/<table>`."
    )
    change_data_feed: StrictBool | None = Field(
        default=None,
        description="Record row-level changes (Delta's change data feed, "
        "`delta.enableChangeDataFeed`); default: on for current-state and history tables.",
    )
    deletion_vectors: StrictBool | None = Field(
        default=None,
        description="Mark deleted and updated rows in deletion vectors instead of rewriting "
        "files (`delta.enableDeletionVectors`): faster MERGEs; delta-rs reads such tables "
        "through its `QueryBuilder`. Default: on for current-state and history tables.",
    )
    column_mapping: Literal["none", "name"] | None = Field(
        default=None,
        description="Delta column mapping (`delta.columnMapping.mode`): `name` allows renaming "
        "and dropping columns without rewriting the table. Default: none.",
    )
    properties: StringMap = Field(
        default_factory=dict,
        description="Further Delta table properties, e.g. `delta.logRetentionDuration: "
        "interval 60 days`.",
    )
    z_order_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Columns OPTIMIZE Z-orders the files by (table maintenance); not with "
        "`cluster_by`.",
    )
    cluster_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Liquid clustering columns (set when the table is created; OPTIMIZE "
        "clusters by them); not with partitioning or `z_order_by`.",
    )
    suite: TableSuite | None = Field(
        default=None,
        description="Great Expectations checks of the whole table (not null, unique, values in "
        "set, between, row count, freshness), run as a Dagster asset check.",
    )

    @field_validator("properties")
    @classmethod
    def _own_properties(cls, properties: dict[str, str]) -> dict[str, str]:
        for key in properties:
            if key in FEATURE_PROPERTIES:
                raise _error(f"{key!r} has a field of its own: use {FEATURE_PROPERTIES[key]}")
            if key.startswith("conflux."):
                raise _error(f"{key!r}: conflux.* properties are Conflux's own records")
            if key in _GUARDED_PROPERTIES and _days(properties[key]) < 7:
                raise _error(
                    f"{key!r} = {properties[key]!r}: Conflux's exactly-once replays and its "
                    "streams need at least 7 days (`interval 7 days`); give a longer interval"
                )
        return properties

    @model_validator(mode="after")
    def _check_layout(self) -> SilverTable:
        if self.cluster_by and self.z_order_by:
            raise _error("give cluster_by or z_order_by, not both", "cluster_by")
        return self

    def stated_properties(self) -> dict[str, str]:
        """The table properties the spec states itself (no role defaults): what a start applies
        to an existing table, so a new default never upgrades a table's protocol unasked."""
        stated = {
            key: ("true" if value else "false") if isinstance(value, bool) else value
            for key, value in (
                ("delta.enableChangeDataFeed", self.change_data_feed),
                ("delta.enableDeletionVectors", self.deletion_vectors),
                ("delta.columnMapping.mode", self.column_mapping),
            )
            if value is not None
        }
        return {**stated, **self.properties}

    def delta_properties(
        self, *, change_data_feed: bool = False, deletion_vectors: bool = False
    ) -> dict[str, str]:
        """The table properties this spec asks for; the keyword arguments are the role's defaults."""
        features = {
            "delta.enableChangeDataFeed": _on(self.change_data_feed, change_data_feed),
            "delta.enableDeletionVectors": _on(self.deletion_vectors, deletion_vectors),
        }
        if self.column_mapping is not None:
            features["delta.columnMapping.mode"] = self.column_mapping
        return {**features, **self.properties}


def _on(value: bool | None, default: bool) -> str:
    return "true" if (default if value is None else value) else "false"


def _days(interval: str) -> float:
    """Days in a Delta interval property (``interval 30 days``); unknown units count as long."""
    match = re.match(r"^\s*(?:interval\s+)?(\d+)\s*(second|minute|hour|day|week)s?\s*$", interval)
    if match is None:
        return float("inf")  # Delta validates the syntax when the property is set
    seconds = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
    return int(match[1]) * seconds[match[2]] / 86400


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
        description="A named rule of `quality/rules.py` (not_null, not_empty, values_in_set, "
        "between, matches, max_length, not_in_future, not_before), with `args`.",
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
        from quality.rules import RuleError, check_rule_args

        if (self.expr is None) == (self.rule is None):
            raise _error("give either expr (SQL) or rule (a named rule), not both or neither")
        if self.rule is None:
            if self.args:
                raise _error("only with rule: an expr takes no arguments", "args")
            return self
        try:
            check_rule_args(self.rule, self.args)
        except RuleError as exc:
            raise _error(str(exc), "args" if self.rule in _rule_names() else "rule") from None
        return self

    def columns(self) -> list[str]:
        """The row columns a rule names (an expr is analysed against the row at start)."""
        from quality.rules import rule_columns

        return rule_columns(self.args) if self.rule is not None else []

    def describe(self) -> str:
        """The expectation as a user wrote it: ``amount >= 0`` or ``between(column=amount, min=0)``."""
        if self.expr is not None:
            return self.expr
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.rule}({arguments})"


def _rule_names() -> list[str]:
    from quality.rules import RULES

    return list(RULES)


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
        columns = self.columns()
        known = f"columns of schema: {', '.join(columns)}"
        if self.event_time is not None and self.event_time not in self.declared_columns():
            raise _error(f"{self.event_time!r} is not a column of schema ({known})", "event_time")
        if self.event_time is not None:
            kind = _ddl_types(self.schema_ddl)[self.event_time]
            if not kind.startswith(("timestamp", "date")):
                raise _error(
                    f"{self.event_time!r} is {kind}; the event time must be a TIMESTAMP or DATE "
                    "column (declare epoch values as TIMESTAMP in the schema, or leave event_time "
                    "out to use the source's time)",
                    "event_time",
                )
        self._check_history(columns, known)
        self._check_expectations(columns, known)
        self._check_suites(columns)
        current = self.current
        if current is None:
            return self
        for name in ("keys", "columns", "except_columns"):
            for column in getattr(current, name):
                if column not in columns:
                    raise _error(
                        f"{column!r} is not a column of schema ({known})", f"current.{name}"
                    )
        kept = current.kept_columns(columns)
        for column in current.partition_by:
            if column not in kept:
                raise _error(
                    f"{column!r} is not a column of the current table ({', '.join(kept)})",
                    "current.partition_by",
                )
        if current.delete_when is not None and self.format != "json":
            raise _error(
                "only with format json (debezium deletes are the events with op = 'd')",
                "current.delete_when",
            )
        self._check_sequence(current.sequence_by, "current.sequence_by", columns)
        return self

    def _check_history(self, columns: tuple[str, ...], known: str) -> None:
        history, current = self.history, self.current
        if history is None:
            return
        if not history.keys and current is None:
            raise _error("is required without a current table", "history.keys")
        keys = self.history_keys
        for name, names in (
            ("keys", history.keys),
            ("track_history", history.track_history),
            ("track_history_except", history.track_history_except),
        ):
            for column in names:
                if column not in columns:
                    raise _error(
                        f"{column!r} is not a column of schema ({known})", f"history.{name}"
                    )
        for name in ("track_history", "track_history_except"):
            named_keys = [c for c in getattr(history, name) if c in keys]
            if named_keys:
                raise _error(
                    f"may not name a key column ({', '.join(named_keys)}): a key identifies "
                    "the versions",
                    f"history.{name}",
                )
        if history.delete_when is not None and self.format != "json":
            raise _error(
                "only with format json (debezium deletes are the events with op = 'd')",
                "history.delete_when",
            )
        for name in ("sequence_by", "delete_when"):
            mine, theirs = getattr(history, name), getattr(current, name, None)
            if mine is not None and theirs is not None and mine != theirs:
                raise _error(
                    f"{mine!r} differs from current.{name} {theirs!r}: the tables of one silver "
                    f"stage share one {name}; leave history.{name} out",
                    f"history.{name}",
                )
        self._check_sequence(history.sequence_by, "history.sequence_by", columns)

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

    def _check_suites(self, columns: tuple[str, ...]) -> None:
        if self.transform is not None:
            return  # the transform may add columns: the suite finds out at run time
        for field, table_columns in self._table_columns(columns).items():
            suite = getattr(self, field).suite
            for column in suite.columns() if suite else ():
                if column not in table_columns:
                    raise _error(
                        f"{column!r} is not a column of the {field} table "
                        f"({', '.join(table_columns)})",
                        f"{field}.suite",
                    )

    def _check_expectations(self, columns: tuple[str, ...], known: str) -> None:
        seen: set[str] = set()
        for index, expectation in enumerate(self.expectations):
            if expectation.name in seen:
                raise _error(
                    f"{expectation.name!r} is the name of an earlier expectation; give each its own",
                    f"expectations.{index}.name",
                )
            seen.add(expectation.name)
            for column in expectation.columns():
                if column not in columns and column not in EVENT_METADATA_COLUMNS:
                    raise _error(
                        f"{column!r} is neither a column of schema ({known}) nor a metadata "
                        f"column ({', '.join(EVENT_METADATA_COLUMNS)})",
                        f"expectations.{index}.args.column",
                    )

    def _check_sequence(self, sequence: str | None, field: str, columns: tuple[str, ...]) -> None:
        if sequence is not None and IDENTIFIER_RE.match(sequence):
            metadata = [
                c
                for c in EVENT_METADATA_COLUMNS
                if c not in ("_sequence", "_event_date") and c not in _NULL_METADATA[self.format]
            ]
            if sequence not in columns and sequence not in metadata:
                raise _error(
                    f"{sequence!r} is neither a column of schema nor one of {', '.join(metadata)} "
                    f"(format {self.format}); give a column or a SQL expression",
                    field,
                )


class MaintenanceSpec(_Model):
    """Table maintenance of the flow's Delta tables (a Dagster job per flow, and `conflux
    maintain FLOW`): OPTIMIZE compacts the small files streaming commits leave, VACUUM removes
    the files no table version within the retention needs."""

    schedule: Cron | None = Field(
        default=None,
        description="When the maintenance job runs (cron, UTC), e.g. `0 3 * * *`; default: "
        "only when launched.",
    )
    optimize: StrictBool = Field(default=True, description="Run OPTIMIZE on every table.")
    vacuum: StrictBool = Field(default=True, description="Run VACUUM on every table.")
    vacuum_retention: Retention = Field(
        default="7 days",
        description="Keep removed files at least this long (Delta's minimum: 7 days); raised "
        "for a table that a stream of the flow has not read up to yet. Readers of the change "
        "data feed outside Conflux must not fall further behind than this.",
    )

    @field_validator("vacuum_retention")
    @classmethod
    def _at_least_a_week(cls, retention: str) -> str:
        if _days(retention) < 7:
            raise _error(
                f"{retention!r} is below Delta's minimum of 7 days: streams that restart from "
                "an older version, and time travel, need the files"
            )
        return retention


# --- gold ---------------------------------------------------------------------------------------

#: A window length, a lateness or a skew: whole units, seconds to days.
#: ``gold[].aggregates[].function`` -> whether it needs a column.
AGGREGATE_FUNCTIONS = {
    "count": False,
    "sum": True,
    "min": True,
    "max": True,
    "avg": True,
    "approx_count_distinct": True,
}
#: Columns every gold table has besides its group keys and aggregates.
GOLD_METADATA_COLUMNS = ("window_start", "window_end", "_rows", "_event_date", "_updated_at")
#: Columns of the silver events a gold stage may read besides the schema's.
GOLD_INPUT_METADATA = ("_event_time", "_op", "_source_topic", "_source_partition", "_source_offset")


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
    path: LocalPath | None = Field(
        default=None, description="Location of the table; default: `<lake>/gold/<table>`."
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

    path: LocalPath | None = Field(
        default=None, description="Location of the table; default: `<lake>/gold/<table>`."
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
        return self

    def design_key(self) -> str:
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


#: Columns a join's gold table keeps itself.
JOIN_METADATA_COLUMNS = ("_left_time", "_right_time", "_matched", "_event_date", "_joined_at")
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


# --- the flow -------------------------------------------------------------------------------------

#: The spec field naming each role's table, for errors.
_TABLE_FIELDS = {
    "bronze": "target",
    "events": "silver.events.table",
    "quarantine": "silver.quarantine.table",
    "current": "silver.current.table",
    "history": "silver.history.table",
    "gold": "gold.table",
    "late": "gold.late.table",
}


def role_kind(role: str) -> str:
    """The kind of a table role: ``gold/<table>`` and ``late/<table>`` are one per gold table."""
    return role.split("/", 1)[0]


def table_field(role: str) -> str:
    """The spec field naming a role's table, for errors."""
    return _TABLE_FIELDS[role_kind(role)]


class FlowSpec(_Model):
    """A validated flow: ``source`` into the bronze table ``target``, optionally on into silver."""

    _internal_fields: ClassVar[tuple[str, ...]] = ("spec_file",)

    name: Identifier = Field(
        description="Name of the flow (unique): its Dagster assets, checkpoint folder and query."
    )
    description: StrictStr = Field(default="", description="What the flow carries, for people.")
    domain: Identifier | None = Field(
        default=None,
        description="The business domain the flow belongs to: the Dagster asset group of its "
        "tables and sources; default: the flow's name.",
    )
    owners: tuple[Owner, ...] = Field(
        default=(),
        description="Who answers for the flow's tables: emails or `team:<name>` (Dagster owners).",
    )
    tags: TagMap = Field(
        default_factory=dict,
        description="Tags of every asset of the flow, e.g. `{tier: critical}` (Dagster tags: "
        "keys and values of letters, digits, `_`, `-`, `.`; at most 63 characters).",
    )
    source: Source = Field(discriminator="kind", description="Where the records come from.")
    target: Target = Field(description="The bronze Delta table.")
    trigger: Trigger = Field(
        default=Trigger(), description="When micro-batches run; default: `available_now`."
    )
    silver: SilverSpec | None = Field(
        default=None, description="Parse the payloads into silver tables (Kafka sources only)."
    )
    gold: tuple[GoldTable, ...] = Field(
        default=(),
        description="Gold tables: windowed aggregates of the silver events by event time, or "
        "stream-stream joins of them (needs `silver`).",
    )
    maintenance: MaintenanceSpec = Field(
        default=MaintenanceSpec(),
        description="OPTIMIZE and VACUUM of the flow's tables, and when they run.",
    )
    spec_file: SkipJsonSchema[str] = Field(
        default="<inline>", description="The file the spec was read from (set by the loader)."
    )

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.context and "where" in info.context:
            data["spec_file"] = info.context["where"]
        silver, name = data.get("silver"), data.get("name")
        if isinstance(silver, dict) and isinstance(name, str) and IDENTIFIER_RE.match(name):
            defaults = {
                role: {"table": f"silver_{name}_{role}"}
                for role in ("events", "quarantine")
                if silver.get(role) is None
            }
            data["silver"] = {**silver, **defaults}
        return data

    @model_validator(mode="after")
    def _check(self) -> FlowSpec:
        if isinstance(self.source, FileSource) and "topic" in self.target.partition_by:
            raise _error("a files source has no topic column", "target.partition_by")
        if self.silver is not None and not isinstance(self.source, KafkaSource):
            raise _error(
                "silver parses Kafka payloads; a files source lands typed columns in bronze "
                "already: silver over files is not supported yet",
                "silver",
            )
        seen: dict[str, str] = {}
        for role, table in self.tables():
            if table in seen:
                raise _error(
                    f"{table!r} is already the {seen[table]} table; give each table of a flow "
                    "its own name",
                    table_field(role) + (".table" if role == "bronze" else ""),
                )
            seen[table] = role
        for index, gold in enumerate(self.gold):
            self._check_gold(gold, f"gold.{index}")
        return self

    def _check_gold(self, gold: GoldSpec | GoldJoinSpec, field: str) -> None:
        if self.silver is None:
            raise _error("gold reads the silver events: declare a silver stage", field)
        if isinstance(gold, GoldSpec):
            self.check_event_columns(gold.input_columns(), gold.event_time, field)
            return
        left = gold.join.left
        self.check_event_columns(gold.side_columns("left"), left.event_time, f"{field}.join.left")
        if gold.join.right_flow(self.name) == self.name:
            right = gold.join.right
            self.check_event_columns(
                gold.side_columns("right"), right.event_time, f"{field}.join.right"
            )

    def check_event_columns(self, columns: Iterable[str], event_time: str, field: str) -> None:
        """``columns`` and the TIMESTAMP ``event_time`` are columns of the flow's silver events
        (unknown until start when a transform may add columns)."""
        silver = self.silver
        if silver is None:
            raise _error(f"flow {self.name} has no silver stage, so no events to read", field)
        if silver.transform is not None:
            return  # the transform may add columns: the stage finds out at start
        types = {**_ddl_types(silver.schema_ddl), "_event_time": "timestamp"}
        names = ", ".join(dict.fromkeys((*types, *GOLD_INPUT_METADATA)))
        known = f"columns of the events of flow {self.name}: {names}"
        for column in (*columns, event_time):
            if column not in types and column not in GOLD_INPUT_METADATA:
                raise _error(f"{column!r} is not one of the {known}", field)
        if not types.get(event_time, "").startswith(("timestamp", "date")):
            raise _error(
                f"{event_time!r} is {types.get(event_time)}; the event time must be a "
                "TIMESTAMP column",
                f"{field}.event_time",
            )

    def tables(self) -> list[tuple[str, str]]:
        """``(role, table)`` of every table the flow writes: bronze, then silver's if any."""
        tables = [("bronze", self.target.table)]
        if self.silver is not None:
            tables += [("events", self.silver.events.table)]
            tables += [("quarantine", self.silver.quarantine.table)]
            if self.silver.current is not None:
                tables += [("current", self.silver.current.table)]
            if self.silver.history is not None:
                tables += [("history", self.silver.history.table)]
        for gold in self.gold:
            tables += [(f"gold/{gold.table}", gold.table), (f"late/{gold.table}", gold.late.table)]
        return tables


# --- loading --------------------------------------------------------------------------------------


def load_spec(path: Path) -> FlowSpec:
    """Parse and validate one spec file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from exc
    return parse_spec(data, where=str(path))


def load_specs(folder: Path) -> list[FlowSpec]:
    """All specs in ``folder`` (``*.yaml``), sorted by name; flow and table names must be unique
    (the tables of every stage: bronze and silver)."""
    specs = sorted((load_spec(p) for p in sorted(folder.glob("*.yaml"))), key=lambda s: s.name)
    names: dict[str, str] = {}
    for spec in specs:
        if spec.name in names:
            raise SpecError(
                f"{spec.spec_file}: name: {spec.name!r} is already used by {names[spec.name]}"
            )
        names[spec.name] = spec.spec_file
    tables: dict[str, str] = {}
    for spec in specs:
        for role, table in spec.tables():
            if table in tables:
                raise SpecError(
                    f"{spec.spec_file}: {table_field(role)}: {table!r} is already used by "
                    f"{tables[table]}"
                )
            tables[table] = spec.spec_file
    by_name = {spec.name: spec for spec in specs}
    for spec in specs:
        for index, gold in enumerate(spec.gold):
            if isinstance(gold, GoldJoinSpec):
                join_input(spec, gold, by_name, f"gold.{index}")
    return specs


def join_input(
    spec: FlowSpec,
    gold: GoldJoinSpec,
    flows: dict[str, FlowSpec] | None = None,
    field: str = "gold",
) -> FlowSpec:
    """The flow whose silver events are the right side of ``gold`` (this flow, or a flow of the
    folder ``spec`` was read from), its columns checked.

    Raises:
        SpecError: no such flow, it has no silver stage, or not the columns the join reads.
    """
    name = gold.join.right_flow(spec.name)
    if name == spec.name:
        return spec
    where = f"{spec.spec_file}: {field}.join.right.flow"
    known: list[str] = sorted(flows or ())
    if flows is None:
        flows = {}
        for path, data in _specs_beside(spec):
            if data.get("name") == name:
                flows[name] = parse_spec(data, where=str(path))
            elif isinstance(data.get("name"), str):
                known.append(data["name"])
    other = flows.get(name)
    if other is None:
        raise SpecError(
            f"{where}: no flow named {name!r} among the specs beside it "
            f"({', '.join(sorted(known)) or 'none'}); name one of them"
        )
    try:
        other.check_event_columns(
            gold.side_columns("right"), gold.join.right.event_time, f"{field}.join.right"
        )
    except PydanticCustomError as exc:
        context = exc.context or {}
        raise SpecError(
            f"{spec.spec_file}: {context.get('field') or field}: {context.get('message', exc)}"
        ) from None
    return other


def _specs_beside(spec: FlowSpec) -> Iterable[tuple[Path, dict[str, Any]]]:
    """The YAML mappings in the folder ``spec`` was read from (unreadable files skipped: they are
    not this lookup's to judge)."""
    for path in sorted(Path(spec.spec_file).parent.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            yield path, data


def join_readers(spec: FlowSpec) -> list[tuple[FlowSpec, GoldJoinSpec]]:
    """The gold joins of other flows beside ``spec`` that read its silver events (as their right
    side): a reset or refresh of its silver events breaks their streams.

    Raises:
        SpecError: a spec beside it names this flow in a join but does not validate (so whether
            its join has streamed cannot be told).
    """
    readers = []
    for path, data in _specs_beside(spec):
        golds = data.get("gold")
        named = isinstance(golds, list) and any(
            isinstance(g, dict)
            and isinstance(g.get("join"), dict)
            and isinstance(g["join"].get("right"), dict)
            and g["join"]["right"].get("flow") == spec.name
            for g in golds
        )
        if not named or data.get("name") == spec.name:
            continue
        other = parse_spec(data, where=str(path))  # a SpecError names the file and the field
        readers += [
            (other, gold)
            for gold in other.gold
            if isinstance(gold, GoldJoinSpec) and gold.join.right_flow(other.name) == spec.name
        ]
    return readers


def parse_spec(data: Any, where: str = "<inline>") -> FlowSpec:
    """Validate a spec given as a parsed YAML mapping."""
    try:
        return FlowSpec.model_validate(data, context={"yaml": True, "where": where})
    except ValidationError as exc:
        raise SpecError(f"{where}: {_describe(exc.errors(include_url=False)[0])}") from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a flow spec file (``conflux schema``), with the YAML key names."""
    schema = FlowSpec.model_json_schema(by_alias=True, mode="validation")
    schema.pop("title", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Conflux flow spec",
        **schema,
    }


# --- pydantic errors in our words -----------------------------------------------------------------

_TYPE_NAMES = {
    "string_type": "str",
    "int_type": "int",
    "bool_type": "bool",
    "float_type": "float",
    "dict_type": "dict",
    "model_type": "dict",
    "model_attributes_type": "dict",
    "list_type": "list",
    "tuple_type": "list",
}
#: How a ``Literal`` field names a wrong value, by field; default: ``unknown <field> 'x'; known: ...``.
_LITERAL_WORDING: dict[str, Callable[[str, list[str]], str]] = {
    "mode": lambda value, known: f"unknown trigger mode {value!r}; known: {', '.join(known)}",
    "format": lambda value, known: f"unknown format {value!r}; known: {', '.join(known)}",
    "starting_offsets": lambda _value, known: f"must be {', '.join(known[:-1])} or {known[-1]}",
}


def _field_path(loc: tuple[int | str, ...]) -> list[str]:
    """The dotted field of a pydantic location: no union tags, no list indices but those of a
    list of models (``silver.expectations.2.rule``)."""
    parts: list[str] = []
    previous: int | str | None = None
    for item in loc:
        tag_follows, previous = previous, item
        if isinstance(item, int):
            if parts[-1:] in (["expectations"], ["gold"], ["aggregates"]):
                parts.append(str(item))
            continue
        if parts == ["source"] and item in SOURCE_KINDS:
            continue  # the discriminated union's tag
        if parts[:1] == ["gold"] and len(parts) == 2 and isinstance(tag_follows, int):
            continue  # the tag of a gold table's kind
        parts.append(item)
    return parts


def _describe(error: ErrorDetails) -> str:
    """``dotted.field: message`` (or the message alone for the whole spec)."""
    parts = _field_path(error["loc"])
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "conflux_spec":
        parts += [p for p in str(ctx.get("field", "")).split(".") if p]
        message = str(ctx["message"])
    elif kind == "missing":
        message = "is required"
    elif kind == "union_tag_not_found":
        parts.append("kind")
        message = "is required"
    elif kind == "union_tag_invalid":
        parts.append("kind")
        tag = value.get("kind") if isinstance(value, dict) else None
        known = ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected_tags", ""))))
        message = (
            f"unknown {parts[-2]} kind {tag!r}; known kinds: {known}"
            if isinstance(tag, str)
            else f"expected str, got {type(tag).__name__}"
        )
    elif kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        field = parts[-1] if parts else ""
        wording = _LITERAL_WORDING.get(
            field, lambda v, k: f"unknown {field} {v!r}; known: {', '.join(k)}"
        )
        message = (
            wording(value, expected)
            if isinstance(value, str)
            else f"expected str, got {type(value).__name__}"
        )
    elif kind in _TYPE_NAMES:
        if not parts:
            return f"the spec must be a mapping, got {type(value).__name__}"
        message = f"expected {_TYPE_NAMES[kind]}, got {type(value).__name__}"
    elif kind == "greater_than" and ctx.get("gt") == 0:
        message = "must be a positive integer"
    elif kind == "too_short":
        message = "is empty; give at least one"
    else:
        message = error["msg"]
    return f"{'.'.join(parts)}: {message}" if parts else message

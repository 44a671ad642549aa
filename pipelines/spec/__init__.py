"""Flow specs: one YAML file declares a flow from a source into a bronze Delta table, and
optionally on into silver (parsed events, a quarantine, current-state and history tables) and gold
(windowed aggregates, stream-stream joins).

A spec is parsed into frozen pydantic models and validated up front; every problem names the
file, the field and the fix (``flows/orders.yaml: source.topics: ...``). A :class:`SpecError`
carries every problem found (:attr:`SpecError.problems`; its message is the first), and
:func:`check_specs` every problem of a folder (``conflux validate`` lists them all). Identifiers
are checked against :data:`IDENTIFIER_RE`, so nothing user-written is pasted into SQL unchecked
except the SQL expressions a spec declares as such (``sequence_by``, ``delete_when``, an
expectation's ``expr``, a join side's ``where``), whose column references are checked against
the columns their stage will have (:mod:`.references`). ``conflux schema`` prints the spec's JSON
Schema (checked in as ``flows/flow.schema.json`` for editors).

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

The package, one job per module (each imports only those listed before it):

- ``base``: :class:`SpecError`, the frozen model base and its error helper;
- ``values``: value types of fields (``Identifier``, ``Duration``, ``Cron``, ...);
- ``columns``: the columns and folders Conflux adds or reserves itself;
- ``ddl``: the silver schema's DDL, parsed without Spark;
- ``references``: the columns a SQL expression names, found without Spark;
- ``expectations``: row expectations (rules from :mod:`quality.rules`) and table suites;
- ``table``: a Delta table's name, location, features and layout (:class:`SilverTable`);
- ``bronze``, ``silver``, ``gold``, ``maintenance``: the models of each part of a spec;
- ``flow``: :class:`FlowSpec`, the checks across its parts, its tables' roles;
- ``errors``: pydantic's errors in our words; ``loading``: one spec from YAML;
- ``lookup``: a folder of specs, and the flows beside a spec (gold joins);
- ``schema``: the JSON Schema.

Import from ``pipelines.spec`` itself: the modules are its layout, not its interface.
"""

from __future__ import annotations

from .base import SpecError, SpecProblem
from .bronze import (
    FILE_FORMATS,
    RESERVED_CHECKPOINT_NAMES,
    SOURCE_KINDS,
    TRIGGER_MODES,
    FileSource,
    KafkaSource,
    Source,
    Target,
    Trigger,
)
from .columns import (
    BRONZE_PARTITION_COLUMNS,
    CURRENT_METADATA_COLUMNS,
    EVENT_METADATA_COLUMNS,
    GOLD_INPUT_METADATA,
    GOLD_METADATA_COLUMNS,
    HISTORY_METADATA_COLUMNS,
    JOIN_METADATA_COLUMNS,
    QUARANTINE_TABLE_COLUMNS,
    RESCUED_DATA_COLUMN,
    SEQUENCE_INPUT_METADATA,
)
from .ddl import SchemaDDL, ddl_fields
from .expectations import (
    EXPECTATION_ACTIONS,
    Bounds,
    Expectation,
    Freshness,
    RowCount,
    Scalar,
    TableSuite,
)
from .flow import FlowSpec
from .gold import (
    AGGREGATE_FUNCTIONS,
    JOIN_SIDES,
    Aggregate,
    AnyGold,
    GoldJoinSpec,
    GoldSpec,
    GoldTable,
    JoinSide,
    JoinSpec,
    LateTable,
    RightSide,
    ScheduledBackfill,
    TimeBound,
    WindowSpec,
)
from .loading import load_spec, parse_spec, read_spec
from .lookup import FolderCheck, check_specs, join_input, join_readers, load_specs
from .maintenance import MaintenanceSpec
from .references import ColumnReference, column_references
from .schema import json_schema
from .silver import (
    DEFAULT_SEQUENCE_BY,
    SILVER_CHAININGS,
    SILVER_FORMATS,
    CurrentSpec,
    HistorySpec,
    SchemaChangePolicy,
    SilverSpec,
)
from .table import FEATURE_PROPERTIES, SilverTable
from .values import (
    CRON_RE,
    DURATION_RE,
    IDENTIFIER_RE,
    INTERVAL_RE,
    OWNER_RE,
    RETENTION_RE,
    TAG_RE,
    TOPIC_RE,
    TRANSFORM_RE,
    Cron,
    Duration,
    Identifier,
    Interval,
    LocalPath,
    Owner,
    Retention,
    SqlFragment,
    StringMap,
    TableLocation,
    TagMap,
    Topic,
    TransformRef,
    duration_seconds,
)

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "BRONZE_PARTITION_COLUMNS",
    "CRON_RE",
    "CURRENT_METADATA_COLUMNS",
    "DEFAULT_SEQUENCE_BY",
    "DURATION_RE",
    "EVENT_METADATA_COLUMNS",
    "EXPECTATION_ACTIONS",
    "FEATURE_PROPERTIES",
    "FILE_FORMATS",
    "GOLD_INPUT_METADATA",
    "GOLD_METADATA_COLUMNS",
    "HISTORY_METADATA_COLUMNS",
    "IDENTIFIER_RE",
    "INTERVAL_RE",
    "JOIN_METADATA_COLUMNS",
    "JOIN_SIDES",
    "OWNER_RE",
    "QUARANTINE_TABLE_COLUMNS",
    "RESCUED_DATA_COLUMN",
    "RESERVED_CHECKPOINT_NAMES",
    "RETENTION_RE",
    "SEQUENCE_INPUT_METADATA",
    "SILVER_CHAININGS",
    "SILVER_FORMATS",
    "SOURCE_KINDS",
    "TAG_RE",
    "TOPIC_RE",
    "TRANSFORM_RE",
    "TRIGGER_MODES",
    "Aggregate",
    "AnyGold",
    "Bounds",
    "ColumnReference",
    "Cron",
    "CurrentSpec",
    "Duration",
    "Expectation",
    "FileSource",
    "FlowSpec",
    "FolderCheck",
    "Freshness",
    "GoldJoinSpec",
    "GoldSpec",
    "GoldTable",
    "HistorySpec",
    "Identifier",
    "Interval",
    "JoinSide",
    "JoinSpec",
    "KafkaSource",
    "LateTable",
    "LocalPath",
    "MaintenanceSpec",
    "Owner",
    "Retention",
    "RightSide",
    "RowCount",
    "Scalar",
    "ScheduledBackfill",
    "SchemaChangePolicy",
    "SchemaDDL",
    "SilverSpec",
    "SilverTable",
    "Source",
    "SpecError",
    "SpecProblem",
    "SqlFragment",
    "StringMap",
    "TableLocation",
    "TableSuite",
    "TagMap",
    "Target",
    "TimeBound",
    "Topic",
    "TransformRef",
    "Trigger",
    "WindowSpec",
    "check_specs",
    "column_references",
    "ddl_fields",
    "duration_seconds",
    "join_input",
    "join_readers",
    "json_schema",
    "load_spec",
    "load_specs",
    "parse_spec",
    "read_spec",
]

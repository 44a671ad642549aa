"""The columns Conflux adds to a flow's tables itself, per layer.

A user's column may not take one of these names (the DDL parser and the gold models refuse them),
and the checks of a spec know a table's columns from them before any table exists.
"""

from __future__ import annotations

# --- bronze

#: Columns bronze adds itself; a user partition column may use ``ingest_date`` too.
BRONZE_PARTITION_COLUMNS = ("ingest_date", "topic")

# --- silver

#: Columns silver adds to the events table after the schema's columns (``_sequence`` is computed
#: from the sequence expression, so it cannot be one of its inputs).
EVENT_METADATA_COLUMNS = (
    "_op", "_sequence", "_event_time", "_event_date", "_source_topic", "_source_partition",
    "_source_offset", "_source_timestamp", "_source_ts_ms", "_source_lsn", "_ingested_at",
    "_batch_id",
)  # fmt: skip
#: The metadata columns a parsed row has when silver computes ``delete_when`` and
#: ``sequence_by`` over it (``_sequence``, ``_event_time``, ``_event_date`` and ``_batch_id`` are
#: added after: see :func:`pipelines.silver.parse.parse_batch`).
SEQUENCE_INPUT_METADATA = (
    "_op", "_source_topic", "_source_partition", "_source_offset", "_source_timestamp",
    "_source_ts_ms", "_source_lsn", "_ingested_at",
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

# --- gold

#: Columns every gold table has besides its group keys and aggregates.
GOLD_METADATA_COLUMNS = ("window_start", "window_end", "_rows", "_event_date", "_updated_at")
#: Columns of the silver events a gold stage may read besides the schema's.
GOLD_INPUT_METADATA = ("_event_time", "_op", "_source_topic", "_source_partition", "_source_offset")

#: Columns a join's gold table keeps itself.
JOIN_METADATA_COLUMNS = ("_left_time", "_right_time", "_matched", "_event_date", "_joined_at")

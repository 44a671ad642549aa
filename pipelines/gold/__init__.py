"""Gold: event-time tables of silver events (windowed aggregates and joins, watermarks, late data,
backfills)."""

#: Columns of the silver events every gold input (and late) row keeps: where it came from.
COORDINATES = ("_source_topic", "_source_partition", "_source_offset", "_batch_id", "_ingested_at")

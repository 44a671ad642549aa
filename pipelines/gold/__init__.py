"""Gold: event-time aggregates of silver events (windows, watermarks, late data, backfills)."""

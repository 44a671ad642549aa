"""Change streams as databases really send them: re-sent changes, unsent values, truncates.

Debezium delivers at least once, and not always whole rows. Three things follow, each for the
``debezium`` format (a ``json`` stream has none of them):

- **Re-sent changes** (:func:`without_redelivered`). A Connect worker killed between two offset
  flushes sends every change since the last flush again, and a connector killed during its
  initial snapshot takes the snapshot again, from a new position. The current table converges
  whatever arrives twice (the sequence decides), but the events table is an append-only log that
  gold aggregates and history read: a change must land in it once. A change is identified by what
  the database gave it, never by its Kafka coordinates (a re-sent change has new ones): its key,
  its ``_source_lsn`` and its op. A snapshot read (op ``r``) is the same as the key's latest
  stored row when its values are: a restarted snapshot reads the same rows at a new position.
- **Unsent values** (:func:`carry_unavailable`). PostgreSQL logs an UPDATE without the TOASTed
  (large, out-of-line) values it did not change, and Debezium sends a placeholder instead. The
  value is the key's: its latest earlier change that carried it, in the batch or in the events
  table. The placeholder is never written; a value no stored change carries sends the record to
  the quarantine.
- **Truncates** (``silver.debezium.truncate: apply``; otherwise the parser quarantines them). A
  TRUNCATE has no key: it is every row older than it. :func:`truncated_before` is its sequence
  for the current table's MERGE (pipelines/silver/current.py) and the history's recomputation
  (pipelines/silver/history.py), which read it from the events table, where it is stored as an
  event with null keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.silver.parse import REASONS, TRUNCATE, UNAVAILABLE, parsed_event

#: A change's identity in the events table (see the module doc), per row.
_CHANGE = "_change"
_STORED_SEQUENCE = "_stored_sequence"
_COORDINATES = ("_source_topic", "_source_partition", "_source_offset")
#: The reason of a record whose unsent value no stored change carries.
UNRESOLVED_PLACEHOLDER = (
    "unchanged TOASTed value not sent by Debezium (its placeholder) in {columns}, and no "
    "earlier change of the key that Conflux stored carries it: read the topic from the "
    "connector's snapshot (source.starting_offsets: earliest), or set REPLICA IDENTITY FULL on "
    "the table"
)


def change_identity(frame: DataFrame, values: Sequence[str]) -> Column:
    """Per event, what makes it the same change when it arrives again: ``op:lsn``, or for a
    snapshot read ``r:`` and a hash of ``values`` (the row as read)."""
    row = F.to_json(F.struct(*(F.col(c) for c in values if c in frame.columns)))
    return F.when(
        F.col("_op") == "r", F.concat(F.lit("r:"), F.xxhash64(row).cast("string"))
    ).otherwise(F.concat(F.col("_op"), F.lit(":"), F.col("_source_lsn").cast("string")))


def _same_key(keys: Sequence[str], left: DataFrame, right: DataFrame) -> Column:
    return F.lit(True) if not keys else _and(*(left[k].eqNullSafe(right[k]) for k in keys))


def _and(*conditions: Column) -> Column:
    result = conditions[0]
    for condition in conditions[1:]:
        result = result & condition
    return result


def without_redelivered(
    events: DataFrame,
    stored_events: DataFrame,
    stored_sequences: DataFrame | None,
    keys: Sequence[str],
    values: Sequence[str],
    batch_id: int,
) -> DataFrame:
    """``events`` (one batch's, parsed) without the changes Debezium delivered again.

    Within the batch, the first record of each change counts (lowest partition and offset).
    Against the table, only *candidates* are looked up: events whose key the current table or
    its deleted keys (``stored_sequences``: keys and ``_sequence``) already hold at their
    sequence or later, and every snapshot read of a stored key (a restarted snapshot reads at a
    new, higher position). A fresh change is newer than anything stored for its key, so in the
    usual batch there is no candidate and the events table is not read. Without a current table
    (``stored_sequences`` None) every event is a candidate. Rows the events table got from this
    same batch id (a replay after a crash between the appends) are not duplicates of it.
    """
    identified = events.withColumn(_CHANGE, change_identity(events, values))
    first = Window.partitionBy(*keys, _CHANGE).orderBy("_source_partition", "_source_offset")
    unique = (
        identified.withColumn("_nth", F.row_number().over(first))
        .where(F.col("_nth") == 1)
        .drop("_nth")
    )
    if stored_sequences is None:
        fresh, candidates = unique.limit(0), unique
    else:
        stored = stored_sequences.groupBy(*keys).agg(F.max("_sequence").alias(_STORED_SEQUENCE))
        joined = unique.join(stored, list(keys), "left")
        is_candidate = F.col(_STORED_SEQUENCE).isNotNull() & (
            (F.col("_op") == "r") | (F.col("_sequence") <= F.col(_STORED_SEQUENCE))
        )
        candidate = (F.col("_op") == TRUNCATE) | F.coalesce(is_candidate, F.lit(False))
        fresh = joined.where(~candidate).drop(_STORED_SEQUENCE)
        candidates = joined.where(candidate).drop(_STORED_SEQUENCE)
    prior = stored_events.where(F.col("_batch_id") != batch_id)
    prior = prior.join(F.broadcast(candidates.select(*keys).distinct()), list(keys), "left_semi")
    known = _known_changes(prior, keys, values)
    same = _and(_same_key(keys, candidates, known), candidates[_CHANGE] == known[_CHANGE])
    new = candidates.join(known, same, "left_anti")
    return fresh.unionByName(new).drop(_CHANGE).select(*events.columns)


def _known_changes(prior: DataFrame, keys: Sequence[str], values: Sequence[str]) -> DataFrame:
    """The identities a candidate is compared with: every stored change's, and, for a snapshot
    read, the key's latest stored row as a read (a read that finds the row as the stream left
    it changes nothing, whether the stored row came from a read or from a change)."""
    latest = Window.partitionBy(*keys).orderBy(
        *(F.col(c).desc() for c in ("_sequence", "_source_partition", "_source_offset"))
    )
    row = F.to_json(F.struct(*(F.col(c) for c in values if c in prior.columns)))
    as_read = (
        prior.where(F.col("_op") != TRUNCATE)
        .withColumn("_nth", F.row_number().over(latest))
        .where(F.col("_nth") == 1)
        .select(*keys, F.concat(F.lit("r:"), F.xxhash64(row).cast("string")).alias(_CHANGE))
    )
    changes = prior.where(F.col("_op") != "r").select(
        *keys, change_identity(prior, values).alias(_CHANGE)
    )
    return changes.unionByName(as_read)


def carry_unavailable(
    parsed: DataFrame, stored_events: DataFrame, keys: Sequence[str], columns: Sequence[str],
    batch_id: int,
) -> DataFrame:  # fmt: skip
    """``parsed`` (a batch's parse) with each unsent value (:data:`UNAVAILABLE`) replaced by the
    key's latest earlier value of that column, from the batch's events before it or the events
    table; a value found nowhere adds :data:`UNRESOLVED_PLACEHOLDER` to the row's reasons.

    ``columns``: the columns that hold a placeholder in some row of the batch (few: the TOASTed
    ones). Only the rows of keys with a placeholder are read from the events table.
    """
    if not keys:  # no key, no earlier change of it
        return parsed.withColumn(REASONS, F.concat(F.col(REASONS), _unresolved(F.col(UNAVAILABLE))))
    order = ["_sequence", "_source_partition", "_source_offset"]
    needing = parsed.where(parsed_event() & (F.size(UNAVAILABLE) > 0))
    toasted = F.broadcast(needing.select(*keys).distinct())
    mine = parsed.where(parsed_event()).join(toasted, list(keys), "left_semi")
    batch_side = mine.select(
        *keys, "_source_topic", *order, *columns, UNAVAILABLE, F.lit(True).alias("_mine")
    )
    stored = stored_events.where(F.col("_batch_id") != batch_id).join(
        toasted, list(keys), "left_semi"
    )
    stored_side = stored.select(
        *keys,
        "_source_topic",
        *order,
        *(F.col(c) if c in stored_events.columns else F.lit(None).alias(c) for c in columns),
        F.array().cast("array<string>").alias(UNAVAILABLE),
        F.lit(False).alias("_mine"),
    )
    before = Window.partitionBy(*keys).orderBy(*order).rowsBetween(Window.unboundedPreceding, -1)
    carried: dict[str, Column] = {}
    for c in columns:
        sent = F.when(~F.array_contains(UNAVAILABLE, c), F.struct(F.col(c).alias("v")))
        carried[f"_prior_{c}"] = F.last(sent, ignorenulls=True).over(before)
    resolved = batch_side.unionByName(stored_side).withColumns(carried).where("_mine")
    unresolved = F.filter(
        F.array(*(F.when(F.array_contains(UNAVAILABLE, c) & F.col(f"_prior_{c}").isNull(),
                         F.lit(c)) for c in columns)),
        lambda name: name.isNotNull(),
    )  # fmt: skip
    fills = resolved.select(
        *(F.col(c).alias(f"_fill_{c}") for c in _COORDINATES),
        *(F.col(f"_prior_{c}")["v"].alias(f"_fill_{c}") for c in columns),
        unresolved.alias("_unresolved"),
    )
    on = _and(*(parsed[c].eqNullSafe(fills[f"_fill_{c}"]) for c in _COORDINATES))
    joined = parsed.join(fills, on, "left")
    unsent = F.coalesce(F.col(UNAVAILABLE), F.array().cast("array<string>"))
    filled = {
        c: F.when(F.array_contains(unsent, c), F.col(f"_fill_{c}")).otherwise(F.col(c))
        for c in columns
    }
    return (
        joined.withColumns(filled)
        .withColumn(REASONS, F.concat(F.col(REASONS), _unresolved(F.col("_unresolved"))))
        .select(*parsed.columns)
    )


def _unresolved(columns: Column) -> Column:
    """:data:`UNRESOLVED_PLACEHOLDER` for the (array of) ``columns`` when there are any, as an
    array of reasons (empty otherwise)."""
    before, after = UNRESOLVED_PLACEHOLDER.split("{columns}")
    named = F.concat(F.lit(before), F.array_join(columns, ", "), F.lit(after))
    return F.when(F.size(F.coalesce(columns, F.array())) > 0, F.array(named)).otherwise(
        F.array().cast("array<string>")
    )


def unavailable_columns(parsed: DataFrame) -> list[str]:
    """The columns holding a placeholder in some event of ``parsed`` (a small collect: names)."""
    rows = (
        parsed.where(parsed_event()).select(F.explode(UNAVAILABLE).alias("c")).distinct().collect()
    )
    return sorted(row["c"] for row in rows)


def truncated_before(events: DataFrame) -> object | None:
    """The sequence of the batch's latest TRUNCATE (every row older than it is gone), or None."""
    row = events.where(F.col("_op") == TRUNCATE).agg(F.max("_sequence").alias("at")).first()
    return None if row is None else row["at"]

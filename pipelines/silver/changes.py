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
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.held import hold, release
from pipelines.silver.current import truncate_floor
from pipelines.silver.parse import REASONS, TRUNCATE, UNAVAILABLE, parsed_event

#: A change's identity in the events table (see the module doc), per row.
_CHANGE = "_change"
_STORED_SEQUENCE = "_stored_sequence"
_COORDINATES = ("_source_topic", "_source_partition", "_source_offset")
#: Why an unsent value was not carried forward, after "unchanged TOASTed value not sent by
#: Debezium (its placeholder) in <columns>, ": none stored, no key, a transform.
NOT_STORED = (
    "and no earlier change of the key that Conflux stored carries it: read the topic from the "
    "connector's snapshot (source.starting_offsets: earliest)"
)
NO_KEY = (
    "and the flow declares no key (silver.current or silver.history keys) to find the row's "
    "earlier value by"
)
TRANSFORMED = (
    "and Conflux carries stored values forward only in flows without a silver.transform (the "
    "events table holds the transform's output, not the values the record lacks)"
)
_UNSENT = "unchanged TOASTed value not sent by Debezium (its placeholder) in "


def change_identity(values: Sequence[str]) -> Column:
    """Per event, what makes it the same change when it arrives again: ``op:lsn``; for a
    snapshot read ``r:`` and a hash of ``values`` (the row as read). An event without a
    ``_source_lsn`` (connectors other than PostgreSQL's) is only itself, by its coordinates:
    Conflux does not deduplicate their changes."""
    coordinates = F.concat_ws("/", *(F.col(c).cast("string") for c in _COORDINATES))
    return (
        F.when(F.col("_source_lsn").isNull(), F.concat(F.lit("@"), coordinates))
        .when(F.col("_op") == "r", _as_read(values))
        .otherwise(F.concat(F.col("_op"), F.lit(":"), F.col("_source_lsn").cast("string")))
    )


def _as_read(values: Sequence[str]) -> Column:
    """A row's identity as a snapshot read of it: ``r:`` and a hash of its ``values``."""
    row = F.to_json(F.struct(*(F.col(c) for c in values)))
    return F.concat(F.lit("r:"), F.xxhash64(row).cast("string"))


def _same_key(keys: Sequence[str], left: DataFrame, right: DataFrame) -> Column:
    return F.lit(True) if not keys else _and(*(left[k].eqNullSafe(right[k]) for k in keys))


def _and(*conditions: Column) -> Column:
    result = conditions[0]
    for condition in conditions[1:]:
        result = result & condition
    return result


#: Sequence types whose order Python's comparison reproduces: numbers, dates, timestamps without
#: a time zone, and strings of the binary collation (UTF-8 bytes sort in code-point order).
#: Not TIMESTAMP: PySpark returns it as the driver's naive local time, whose order a daylight-
#: saving change breaks. A NaN compares false both ways, so it is never "newer" (see ``after``).
_ORDERED_IN_PYTHON = (T.NumericType, T.StringType, T.DateType, T.TimestampNTZType)


@dataclass(frozen=True)
class Stored:
    """The highest ``_sequence`` the current table and its deleted keys hold (``value`` None: they
    hold none), known to the process that writes them: see :func:`without_redelivered`."""

    value: object | None

    def after(self, highest: object | None) -> Stored | None:
        """What is stored once a batch whose highest sequence is ``highest`` is written (its
        MERGE may store less: an over-estimate only sends a batch down the lookup path); None
        (unknown) when the two cannot be compared."""
        if highest is None:
            return self
        if self.value is None or _greater(highest, self.value):
            return Stored(highest)
        if type(highest) is type(self.value) and bool(highest <= self.value):  # type: ignore[operator]
            return self
        return None  # not comparable (a NaN, say): read from the tables again


@dataclass(frozen=True)
class Kept:
    """What :func:`without_redelivered` keeps of a batch: ``events`` (the batch's columns),
    their ``count``, the held frame(s) they read, to release when the batch is done (``events``
    may be a projection of a held frame, which :func:`pipelines.held.release` does not free by
    itself), and the highest sequence among them (None without any, or when the sequence's
    type is not one :class:`Stored` can compare)."""

    events: DataFrame
    count: int
    held: tuple[DataFrame, ...]
    highest: object | None = None


def ordered_in_python(events: DataFrame) -> bool:
    """Whether the events' ``_sequence`` can be compared in the driver (:class:`Stored`)."""
    kind = events.schema["_sequence"].dataType
    if isinstance(kind, T.StringType):
        return kind.collation == "UTF8_BINARY"
    return isinstance(kind, _ORDERED_IN_PYTHON)


def without_redelivered(
    events: DataFrame,
    stored_events: DataFrame,
    stored_sequences: DataFrame | None,
    keys: Sequence[str],
    values: Sequence[str],
    batch_id: int,
    stored: Stored | None = None,
) -> Kept:
    """``events`` (one batch's, parsed) without the changes Debezium delivered again, held.

    Within the batch, the first record of each change counts (lowest partition and offset).
    Against the events table, only *candidates* are looked up: events whose key the current
    table or its deleted keys (``stored_sequences``: keys and ``_sequence``) hold at their
    sequence or later, events not newer than a stored TRUNCATE (the deleted keys' row with null
    keys), snapshot reads of stored keys and TRUNCATEs. A fresh change is newer than anything
    stored for its key: a batch without candidates reads the events table not at all. Without a
    current table (``stored_sequences`` None) every event is a candidate.

    ``stored``, when the caller knows it (the highest sequence in ``stored_sequences``, or more):
    a batch of changes (no snapshot reads, no TRUNCATE) all newer than it has no candidate, and
    is decided without reading the stored sequences at all (two small jobs over the batch: the
    steady state of a stream, whose every change is newer than the last). Otherwise the stored
    sequences of the batch's keys are joined to it, held, and counted.

    The events table's rows from this same batch id (a replay after a crash between the writes)
    are not duplicates of it; the writes of the batch only ever raise stored sequences, so a
    replay finds the same candidates or more, and decides each from the events table as it was
    before the batch.
    """
    shared = [c for c in values if c in events.columns and c in stored_events.columns]
    identified = events.withColumn(_CHANGE, change_identity(shared))
    first = Window.partitionBy(*keys, _CHANGE).orderBy("_source_partition", "_source_offset")
    unique = (
        identified.withColumn("_nth", F.row_number().over(first))
        .where(F.col("_nth") == 1)
        .drop("_nth")
    )
    if stored_sequences is None:
        kept = hold(
            _not_stored(unique, stored_events, keys, shared, batch_id).select(*events.columns)
        )
        return _counted(kept)
    unique = hold(unique)
    try:
        tally = _tally(unique, ordered_in_python(events))
        if stored is not None and tally.newer_than(stored):
            return Kept(unique.select(*events.columns), tally.rows, (unique,), tally.highest)
        joined = hold(_with_stored_sequence(unique, stored_sequences, keys))
    except BaseException:
        release(unique)
        raise
    release(unique)
    try:
        candidate = F.coalesce(F.col("_candidate"), F.lit(False))
        fresh = joined.where(~candidate).drop("_candidate")
        candidates = joined.where(candidate).drop("_candidate")
        if candidates.isEmpty():  # every change is fresh: the held join is the answer
            return Kept(fresh.select(*events.columns), tally.rows, (joined,), tally.highest)
        new = _not_stored(candidates, stored_events, keys, shared, batch_id)
        kept = hold(fresh.drop(_CHANGE).unionByName(new).select(*events.columns))
    except BaseException:
        release(joined)
        raise
    release(joined)
    return _counted(kept, tally.highest)


def _counted(kept: DataFrame, highest: object | None = None) -> Kept:
    """``kept`` (held) as :class:`Kept`, counted; released if the count fails."""
    try:
        return Kept(kept, kept.count(), (kept,), highest)
    except BaseException:
        release(kept)
        raise


@dataclass(frozen=True)
class Tally:
    """One job's look at a batch's unique changes (see :func:`_tally`)."""

    rows: int
    lowest: object | None
    highest: object | None
    unordered: int  # snapshot reads and TRUNCATEs: decided by key and values, not by sequence

    def newer_than(self, stored: Stored) -> bool:
        """Whether every change is newer than anything stored (so none is a candidate)."""
        if self.unordered:
            return False
        return self.rows == 0 or stored.value is None or _greater(self.lowest, stored.value)


def _greater(value: object | None, than: object) -> bool:
    """``value > than`` for two sequences of one type the driver orders as Spark does."""
    return (
        value is not None and type(value) is type(than) and bool(value > than)  # type: ignore[operator]
    )


def _tally(unique: DataFrame, ordered: bool) -> Tally:
    """The batch's row count, its lowest and highest sequence (None when ``ordered`` is false:
    the driver cannot compare them) and its snapshot reads and TRUNCATEs: one job."""
    sequence = F.col("_sequence") if ordered else F.lit(None)
    row = unique.agg(
        F.count(F.lit(1)),
        F.min(sequence),
        F.max(sequence),
        F.count(F.when(F.col("_op").isin("r", TRUNCATE), 1)),
    ).first()
    assert row is not None  # a global aggregate has one row
    return Tally(int(row[0]), row[1], row[2], int(row[3]))


def _with_stored_sequence(
    unique: DataFrame, stored_sequences: DataFrame, keys: Sequence[str]
) -> DataFrame:
    """``unique`` with ``_candidate``: whether the event must be looked up (see
    :func:`without_redelivered`). Only the stored rows of the batch's keys are aggregated."""
    batch_keys = F.broadcast(unique.where(F.col("_op") != TRUNCATE).select(*keys).distinct())
    stored = (
        stored_sequences.join(batch_keys, list(keys), "left_semi")
        .groupBy(*keys)
        .agg(F.max("_sequence").alias(_STORED_SEQUENCE))
    )
    floor = truncate_floor(stored_sequences, keys, "_floor")
    joined = unique.join(stored, list(keys), "left").crossJoin(F.broadcast(floor))
    held_key = F.col(_STORED_SEQUENCE).isNotNull() & (
        (F.col("_op") == "r") | (F.col("_sequence") <= F.col(_STORED_SEQUENCE))
    )
    candidate = (F.col("_op") == TRUNCATE) | held_key | (F.col("_sequence") <= F.col("_floor"))
    return joined.withColumn("_candidate", candidate).drop(_STORED_SEQUENCE, "_floor")


def _not_stored(
    candidates: DataFrame,
    stored_events: DataFrame,
    keys: Sequence[str],
    values: Sequence[str],
    batch_id: int,
) -> DataFrame:
    """The ``candidates`` (with ``_change``) the events table does not already hold."""
    prior = stored_events.where(F.col("_batch_id") != batch_id)
    truncates = prior.where(F.col("_op") == TRUNCATE)
    if keys:
        keyed = F.broadcast(candidates.where(F.col("_op") != TRUNCATE).select(*keys).distinct())
        prior = prior.join(keyed, list(keys), "left_semi")
    else:  # no key to narrow by: the candidates' positions (files outside them are skipped)
        bounds = candidates.agg(F.min("_source_lsn"), F.max("_source_lsn")).first()
        assert bounds is not None
        prior = prior.where(F.col("_source_lsn").between(bounds[0], bounds[1]))
    known = _known_changes(prior, truncates, keys, values)
    same = _and(_same_key(keys, candidates, known), candidates[_CHANGE] == known[_CHANGE])
    return candidates.join(known, same, "left_anti").drop(_CHANGE)


def _known_changes(
    prior: DataFrame, truncates: DataFrame, keys: Sequence[str], values: Sequence[str]
) -> DataFrame:
    """The identities a candidate is compared with: every stored change's (snapshot reads and
    TRUNCATEs too, these with their null keys), and, for a snapshot read, the key's latest
    stored row as a read (a read that finds the row as the stream left it changes nothing,
    whether the stored row came from a read or a change), unless that row was deleted or
    truncated since."""
    identity = change_identity(values).alias(_CHANGE)
    changes = prior.select(*keys, identity)
    changes = changes.unionByName(truncates.select(*keys, identity))
    if not keys:
        return changes
    latest = Window.partitionBy(*keys).orderBy(
        *(F.col(c).desc() for c in ("_sequence", "_source_partition", "_source_offset"))
    )
    cut = truncates.agg(F.max("_sequence").alias("_cut"))
    as_read = (
        prior.withColumn("_nth", F.row_number().over(latest))
        .where(F.col("_nth") == 1)
        .crossJoin(F.broadcast(cut))
        .where(
            (F.col("_op") != "d") & (F.col("_cut").isNull() | (F.col("_sequence") > F.col("_cut")))
        )
        .select(*keys, _as_read(values).alias(_CHANGE))
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
        .withColumn(REASONS, F.concat(F.col(REASONS), _unsent(F.col("_unresolved"), NOT_STORED)))
        .select(*parsed.columns)
    )


def refuse_unavailable(parsed: DataFrame, why: str) -> DataFrame:
    """``parsed`` with each event holding a placeholder quarantined, saying ``why`` its value is
    not carried forward (:data:`NO_KEY`, :data:`TRANSFORMED`)."""
    unsent = F.when(parsed_event(), F.col(UNAVAILABLE))
    return parsed.withColumn(REASONS, F.concat(F.col(REASONS), _unsent(unsent, why)))


def _unsent(columns: Column, why: str) -> Column:
    """The reason naming the (array of) ``columns`` whose placeholder stays unresolved, and
    ``why``, as an array of reasons: empty without such columns."""
    named = F.concat(F.lit(_UNSENT), F.array_join(columns, ", "), F.lit(f", {why}"))
    return F.when(F.size(F.coalesce(columns, F.array())) > 0, F.array(named)).otherwise(
        F.array().cast("array<string>")
    )


def unavailable_columns(parsed: DataFrame) -> list[str]:
    """The columns holding a placeholder in some row of ``parsed`` (a small collect: names),
    whatever the expectations made of the row: they judged it before the carry."""
    rows = parsed.select(F.explode(UNAVAILABLE).alias("c")).distinct().collect()
    return sorted(row["c"] for row in rows)


def truncated_before(events: DataFrame) -> object | None:
    """The sequence of the batch's latest TRUNCATE (every row older than it is gone), or None."""
    row = events.where(F.col("_op") == TRUNCATE).agg(F.max("_sequence").alias("at")).first()
    return None if row is None else row["at"]

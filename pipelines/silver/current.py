"""Current-state (SCD type 1) tables: the latest row per key, kept from a change stream by MERGE.

The model is a compacted Kafka topic: the table holds the newest version of every live key, and a
delete removes the key. "Newest" is decided by the declared sequence (``sequence_by``), never by
arrival order, so out-of-order and duplicated events converge to the same table:

1. :func:`reduce_batch` turns a micro-batch's events into one row per key: the event with the
   highest ``(_sequence, partition, offset)``. With ``ignore_null_updates`` each column is instead
   the newest non-null value among the key's events after its last delete in the batch, and
   ``_replaces`` says that the row follows a delete in the same batch (so it replaces the stored
   row instead of completing it); events not newer than the stored row are dropped first
   (:func:`drop_stale`), so that a late partial update cannot fill a newer one's gaps.
   On a sequence tie a delete wins, within a batch and across batches alike.
2. Deleted keys are remembered in a side table ``<table>__deleted_keys`` (key, ``_sequence``,
   ``_deleted_at``) for ``deleted_key_retention``: an upsert not newer than a key's delete is
   dropped before the MERGE, so a late update cannot resurrect a deleted key. The current table
   itself holds live rows only, and its change data feed shows deletes as deletes.
3. :func:`merge_current` applies the batch: a newer delete deletes, a newer upsert updates, an
   unknown key is inserted unless the event is a delete; anything not newer than the stored
   ``_sequence`` changes nothing. :func:`merge_deleted_keys` records the batch's deletes and
   drops tombstones past their retention.

A Debezium TRUNCATE (``silver.debezium.truncate: apply``) is a delete of every key older than
it: :func:`merge_current` deletes the stored rows older than it (a not-matched-by-source clause),
and it is remembered as the deleted-keys row with null keys, below which :func:`drop_deleted`
drops upserts.

Both MERGEs run under the batch's transaction id (:func:`pipelines.delta_writes.idempotent_session`,
one app id per table), so a replayed batch changes neither table again.
"""

from __future__ import annotations

from collections.abc import Sequence

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.spec import CurrentSpec, SilverSpec

#: Columns of a current-state table after its key and value columns.
CURRENT_METADATA = ("_sequence", "_op", "_event_time", "_updated_at")
#: Columns of the deleted-keys side table after the key columns.
DELETED_KEYS_METADATA = ("_sequence", "_deleted_at")
_ORDER = "_order"


def value_columns(spec: SilverSpec, row_columns: Sequence[str] | None = None) -> list[str]:
    """The non-key columns the current table keeps (``columns`` / ``except_columns`` applied)
    of the row's columns: the schema's, or those a transform returns."""
    current = _current(spec)
    row = spec.columns() if row_columns is None else row_columns
    return [c for c in current.kept_columns(row) if c not in current.keys]


def _current(spec: SilverSpec) -> CurrentSpec:
    assert spec.current is not None, "only silver stages with a current table reach here"
    return spec.current


def _quoted(name: str) -> str:
    return f"`{name}`"


def reduce_batch(
    events: DataFrame, spec: SilverSpec, row_columns: Sequence[str] | None = None
) -> DataFrame:
    """One row per key: what the batch's events for that key amount to (see module doc)."""
    current = _current(spec)
    keys = list(current.keys)
    # Newest by sequence; on a tie a delete wins (as across batches, see merge_current), then
    # the later record of the partition.
    order = F.struct(
        "_sequence",
        (F.col("_op") == "d").alias("_is_delete"),
        "_source_partition",
        "_source_offset",
    )
    last_delete = F.max(F.when(F.col("_op") == "d", F.col(_ORDER))).over(Window.partitionBy(*keys))
    ranked = events.withColumn(_ORDER, order).withColumn("_last_delete", last_delete)
    after_delete = F.col("_last_delete").isNull() | (F.col(_ORDER) > F.col("_last_delete"))

    def newest(column: str) -> Column:
        if current.ignore_null_updates:
            ordering = F.when(F.col(column).isNotNull() & after_delete, F.col(_ORDER))
            return F.max_by(column, ordering).alias(column)
        return F.max_by(column, _ORDER).alias(column)

    return ranked.groupBy(*keys).agg(
        *(newest(c) for c in value_columns(spec, row_columns)),
        F.max_by("_sequence", _ORDER).alias("_sequence"),
        F.max_by("_op", _ORDER).alias("_op"),
        F.max_by("_event_time", _ORDER).alias("_event_time"),
        F.max("_last_delete").isNotNull().alias("_replaces"),
    )


def drop_stale(
    events: DataFrame, current: DataFrame, deleted_keys: DataFrame, spec: SilverSpec
) -> DataFrame:
    """Events not newer than their key's stored row or remembered delete.

    Needed before :func:`reduce_batch` only with ``ignore_null_updates``: there a stale event's
    non-null values would otherwise fill the newer event's nulls (without it the newest event
    decides alone, and the MERGE conditions drop it when it is stale). Both tables are read as
    they were before this batch wrote them, on a replay too: the MERGEs come after.
    """
    keys = list(_current(spec).keys)
    stored = (
        current.select(*keys, "_sequence")
        .unionByName(deleted_keys.select(*keys, "_sequence"))
        .groupBy(*keys)
        .agg(F.max("_sequence").alias("_stored_sequence"))
    )
    fresh = (
        events.join(stored, keys, "left")
        .where(
            F.col("_stored_sequence").isNull() | (F.col("_sequence") > F.col("_stored_sequence"))
        )
        .drop("_stored_sequence")
    )
    return _after_truncate(fresh, deleted_keys, spec)


def drop_deleted(reduced: DataFrame, deleted_keys: DataFrame, spec: SilverSpec) -> DataFrame:
    """Upserts not newer than their key's remembered delete are dropped; deletes pass."""
    keys = list(_current(spec).keys)
    tombstones = deleted_keys.select(*keys, F.col("_sequence").alias("_deleted_sequence"))
    kept = (
        reduced.join(tombstones, keys, "left")
        .where(
            (F.col("_op") == "d")
            | F.col("_deleted_sequence").isNull()
            | (F.col("_sequence") > F.col("_deleted_sequence"))
        )
        .drop("_deleted_sequence")
    )
    return _after_truncate(kept, deleted_keys, spec, deletes_pass=True)


def _after_truncate(
    frame: DataFrame, deleted_keys: DataFrame, spec: SilverSpec, deletes_pass: bool = False
) -> DataFrame:
    """``frame``'s events newer than the flow's last TRUNCATE (``silver.debezium.truncate:
    apply``), remembered as the deleted-keys row with null keys: every key older than it is
    gone. ``deletes_pass``: keep deletes whatever their sequence (a delete deletes nothing
    more)."""
    if spec.format != "debezium" or spec.debezium.truncate != "apply":
        return frame
    floor = truncate_floor(deleted_keys, _current(spec).keys, "_truncated_at")
    newer = F.col("_truncated_at").isNull() | (F.col("_sequence") > F.col("_truncated_at"))
    if deletes_pass:
        newer = newer | (F.col("_op") == "d")
    return frame.crossJoin(F.broadcast(floor)).where(newer).drop("_truncated_at")


def truncate_floor(deleted_keys: DataFrame, keys: Sequence[str], name: str) -> DataFrame:
    """One row, column ``name``: the sequence of the flow's last TRUNCATE, the deleted-keys row
    with null keys (null when it never truncated). Every row older than it is gone."""
    truncates = deleted_keys
    for key in keys:
        truncates = truncates.where(F.col(key).isNull())
    return truncates.agg(F.max("_sequence").alias(name))


def merge_current(
    target: DeltaTable,
    source: DataFrame,
    spec: SilverSpec,
    row_columns: Sequence[str] | None = None,
    truncated_at: object | None = None,
) -> None:
    """MERGE one reduced batch into the current-state table (run under the batch's txn id).

    ``truncated_at``: the sequence of the batch's latest TRUNCATE (the source then holds only
    changes newer than it): every stored row older than it is deleted, and a source row replaces
    (rather than completes) a stored row older than it."""
    current = _current(spec)
    on = " AND ".join(f"t.{_quoted(k)} <=> s.{_quoted(k)}" for k in current.keys)
    newer = "s._sequence > t._sequence"
    values = value_columns(spec, row_columns)
    replaces = "s._replaces" if truncated_at is None else "(s._replaces OR t._sequence < s._cut)"
    if truncated_at is not None:
        source = source.withColumn("_cut", F.lit(truncated_at))
    if current.ignore_null_updates:
        updates: dict[str, str | Column] = {
            _quoted(c): f"CASE WHEN {replaces} THEN s.{_quoted(c)} "
            f"ELSE coalesce(s.{_quoted(c)}, t.{_quoted(c)}) END"
            for c in values
        }
    else:
        updates = {_quoted(c): f"s.{_quoted(c)}" for c in values}
    metadata: dict[str, str | Column] = {
        "_sequence": "s._sequence",
        "_op": "s._op",
        "_event_time": "s._event_time",
        "_updated_at": "current_timestamp()",
    }
    inserts: dict[str, str | Column] = {
        _quoted(c): f"s.{_quoted(c)}" for c in (*current.keys, *values)
    }
    merge = (
        target.alias("t")
        .merge(source.alias("s"), on)
        .whenMatchedDelete(condition="s._sequence >= t._sequence AND s._op = 'd'")
        .whenMatchedUpdate(condition=newer, set={**updates, **metadata})
        .whenNotMatchedInsert(condition="s._op <> 'd'", values={**inserts, **metadata})
    )
    if truncated_at is not None:
        merge = merge.whenNotMatchedBySourceDelete(
            condition=F.col("t._sequence") < F.lit(truncated_at)
        )
    merge.execute()


def merge_deleted_keys(
    target: DeltaTable, reduced: DataFrame, spec: SilverSpec, truncated_at: object | None = None
) -> None:
    """Remember the batch's deletes, and its TRUNCATE (``truncated_at``) as the tombstone with
    null keys; forget tombstones older than ``deleted_key_retention``."""
    current = _current(spec)
    on = " AND ".join(f"t.{_quoted(k)} <=> s.{_quoted(k)}" for k in current.keys)
    deletes = reduced.where(F.col("_op") == "d").select(*current.keys, "_sequence")
    if truncated_at is not None:
        types = {f.name: f.dataType for f in deletes.schema.fields}
        truncate = deletes.sparkSession.range(1).select(
            *(F.lit(None).cast(types[k]).alias(k) for k in current.keys),
            F.lit(truncated_at).cast(types["_sequence"]).alias("_sequence"),
        )
        deletes = deletes.unionByName(truncate)
    stamp: dict[str, str | Column] = {
        "_sequence": "s._sequence",
        "_deleted_at": "current_timestamp()",
    }
    expired = f"t._deleted_at < current_timestamp() - INTERVAL {current.deleted_key_retention}"
    (
        target.alias("t")
        .merge(deletes.alias("s"), on)
        .whenMatchedUpdate(condition="s._sequence > t._sequence", set=stamp)
        .whenNotMatchedInsert(
            values={**{_quoted(k): f"s.{_quoted(k)}" for k in current.keys}, **stamp}
        )
        .whenNotMatchedBySourceDelete(condition=expired)
        .execute()
    )

"""History (SCD type 2) tables: every version of every key, each with its validity interval.

A version of a key is a run of its changes, in ``sequence_by`` order, over which the *tracked*
columns (``track_history`` / ``track_history_except``; default: every non-key column) keep one
value. A row holds the version's values (an untracked column: its newest value within the
version), ``_valid_from`` (the sequence of the change that opened it), ``_valid_to`` (the sequence
of the change that replaced or deleted it; null while it is open), their event times and
``_is_current``. A delete closes the open version; a re-create opens a new one; a change equal to
the open version in its tracked columns (a duplicate, or an untracked change) opens none.

**A key's history is a function of its events**, and the events table holds every event
(append-only, written earlier in the same batch). So each batch recomputes, for the keys it
touches only, their versions from all their events in the events table (:func:`versions_of`),
compares them with the rows the history table holds for those keys, and MERGEs the difference
(:func:`history_changes`, :func:`merge_history`): in the usual case the open version is closed or
updated and one version is inserted; a change arriving late, inside an older version's interval,
splits that version and fixes its neighbours' intervals, with no special path. The price: every
batch scans the whole events table (column-pruned, no key pruning yet) and recomputes the touched
keys' versions; bench/HISTORY.md has the figures.

The MERGE runs under the batch's transaction id, like the current table's, so a replayed batch
changes nothing; on a replay the recomputation reads the same events and the MERGE is skipped.
History must be computed from the whole events table: rows deleted from it would drop versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.silver.parse import TRUNCATE
from pipelines.spec import SilverSpec

#: Columns of a history table after its key and value columns.
HISTORY_METADATA = (
    "_valid_from",
    "_valid_to",
    "_valid_from_time",
    "_valid_to_time",
    "_is_current",
    "_updated_at",
)
_ACTION = "_action"


class Truncates(Enum):
    """Whether a batch's history must see TRUNCATEs: none in the flow (``NONE``), some in the
    events table (``STORED``: the flow applies them), or one in this batch (``IN_BATCH``)."""

    NONE = "none"
    STORED = "stored"
    IN_BATCH = "in_batch"


@dataclass(frozen=True)
class HistoryPlan:
    """What a history table keeps: its keys, its value columns and which of them are tracked."""

    keys: tuple[str, ...]
    values: tuple[str, ...]
    tracked: tuple[str, ...]
    ignore_null_updates: bool = False

    @classmethod
    def of(
        cls, spec: SilverSpec, row_columns: Sequence[str], untracked: Sequence[str] = ()
    ) -> HistoryPlan:
        """The plan for ``spec.history`` over the parsed (and transformed) row's columns.

        ``untracked``: columns kept but never tracked, whatever the spec says: those evolved into
        the tables (:mod:`pipelines.silver.schema_changes`), so that a new field upstream does not
        change what a version is (declare it in the schema to track it, with a full refresh).
        """
        assert spec.history is not None
        keys = spec.history_keys
        values = tuple(c for c in row_columns if c not in keys)
        tracked = spec.history.tracked_columns(values)
        return cls(
            keys=keys,
            values=values,
            tracked=tuple(c for c in tracked if c not in untracked),
            ignore_null_updates=spec.history.ignore_null_updates,
        )


def _q(name: str) -> str:
    return f"`{name}`"


def versions_of(events: DataFrame, plan: HistoryPlan) -> DataFrame:
    """Every version of each key of ``events`` (all of that key's events), one row per version.

    Events are ordered by ``(_sequence, delete, partition, offset)``; of the events of one key
    with one sequence only one counts: a delete if there is one (deletes win ties, as in the
    current table), else the last record. So give every change its own sequence value.
    """
    keys = list(plan.keys)
    frame = events.select(
        *keys,
        *plan.values,
        "_sequence",
        "_event_time",
        F.col("_op").isin("d", TRUNCATE).alias("_is_delete"),
        "_source_partition",
        "_source_offset",
    )
    order = ["_sequence", "_is_delete", "_source_partition", "_source_offset"]
    # One event per (key, sequence), so a version's _valid_from identifies it: a delete if the
    # sequence has one (deletes win ties), else the key's last record at that sequence.
    same_sequence = Window.partitionBy(*keys, "_sequence").orderBy(
        *(F.col(c).desc() for c in order[1:])
    )
    frame = (
        frame.withColumn("_rank", F.row_number().over(same_sequence))
        .where(F.col("_rank") == 1)
        .drop("_rank")
    )
    by_key = Window.partitionBy(*keys).orderBy(*order)
    running = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    frame = frame.withColumn("_order", F.struct(*order))
    if plan.ignore_null_updates:
        carried = [c for c in frame.columns if c not in (*keys, *plan.values)]
        # A null keeps the column's previous value, back to the key's last delete (whose own
        # image, Debezium's before, must not fill a re-create's nulls).
        frame = frame.select(
            *keys,
            *(F.when(~F.col("_is_delete"), F.col(c)).alias(c) for c in plan.values),
            *carried,
        )
        frame = frame.withColumn("_life", F.sum(F.col("_is_delete").cast("int")).over(running))
        life = (
            Window.partitionBy(*keys, "_life")
            .orderBy(*order)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        frame = frame.select(
            *keys,
            *(F.last(c, ignorenulls=True).over(life).alias(c) for c in plan.values),
            *carried,
        )
    after_delete = F.lag("_is_delete", 1, True).over(by_key)
    same_state = F.lit(True)
    for column in plan.tracked:
        same_state = same_state & F.col(column).eqNullSafe(F.lag(column).over(by_key))
    opens = ~F.col("_is_delete") & (after_delete | ~same_state)
    numbered = frame.withColumn("_version", F.sum(opens.cast("int")).over(running)).where(
        F.col("_version") > 0
    )
    upsert_order = F.when(~F.col("_is_delete"), F.col("_order"))
    delete_order = F.when(F.col("_is_delete"), F.col("_order"))
    versions = numbered.groupBy(*keys, "_version").agg(
        *(F.max_by(c, upsert_order).alias(c) for c in plan.values),
        F.min_by("_sequence", upsert_order).alias("_valid_from"),
        F.min_by("_event_time", upsert_order).alias("_valid_from_time"),
        F.min_by("_sequence", delete_order).alias("_deleted_at_sequence"),
        F.min_by("_event_time", delete_order).alias("_deleted_at_time"),
    )
    by_version = Window.partitionBy(*keys).orderBy("_version")
    valid_to = F.coalesce("_deleted_at_sequence", F.lead("_valid_from").over(by_version))
    return versions.select(
        *keys,
        *plan.values,
        "_valid_from",
        valid_to.alias("_valid_to"),
        "_valid_from_time",
        F.coalesce("_deleted_at_time", F.lead("_valid_from_time").over(by_version)).alias(
            "_valid_to_time"
        ),
        valid_to.isNull().alias("_is_current"),
    )


def history_changes(
    batch_events: DataFrame,
    all_events: DataFrame,
    stored: DataFrame,
    plan: HistoryPlan,
    truncates: Truncates = Truncates.NONE,
) -> DataFrame:
    """The rows to upsert into and delete from the history table for the batch's keys.

    ``all_events`` is the events table (including this batch's events), ``stored`` the history
    table. Each row carries ``_action``: ``upsert`` (a version that is new or changed) or
    ``delete`` (a stored version the recomputation no longer has, e.g. one a late change split).

    A TRUNCATE (an event with null keys) is a delete of every key: with ``truncates`` not
    ``NONE``, each key's events include every truncate of the events table, and a batch that
    truncates (``IN_BATCH``) touches every key with an open version too.
    """
    keys = list(plan.keys)
    touched = batch_events.where(F.col("_op") != TRUNCATE).select(*keys).distinct()
    if truncates is Truncates.IN_BATCH:  # every open version: maybe every key, not broadcast
        opened = stored.where(F.col("_is_current")).select(*keys)
        touched = touched.unionByName(opened).distinct()
    else:
        touched = F.broadcast(touched)
    events = all_events.join(touched, keys, "left_semi")
    if truncates is not Truncates.NONE:
        cuts = all_events.where(F.col("_op") == TRUNCATE).drop(*keys)
        events = events.unionByName(F.broadcast(cuts).crossJoin(touched))
    recomputed = versions_of(events, plan)
    held = stored.join(touched, keys, "left_semi")
    compared = [*plan.values, "_valid_to", "_valid_from_time", "_valid_to_time", "_is_current"]
    new = recomputed.select(
        *keys, "_valid_from", F.struct(*compared).alias("_new"), F.lit(True).alias("_in_new")
    )
    old = held.select(
        *keys, "_valid_from", F.struct(*compared).alias("_old"), F.lit(True).alias("_in_old")
    )
    joined = new.join(old, [*keys, "_valid_from"], "full")
    action = F.when(F.col("_in_new").isNull(), F.lit("delete")).when(
        F.col("_in_old").isNull() | ~F.col("_new").eqNullSafe(F.col("_old")), "upsert"
    )
    return (
        joined.withColumn(_ACTION, action)
        .where(F.col(_ACTION).isNotNull())
        .select(*keys, "_valid_from", *(F.col(f"_new.{c}").alias(c) for c in compared), _ACTION)
    )


def merge_history(target: DeltaTable, changes: DataFrame, plan: HistoryPlan) -> None:
    """MERGE :func:`history_changes` into the history table (run under the batch's txn id)."""
    on = " AND ".join(
        [*(f"t.{_q(k)} <=> s.{_q(k)}" for k in plan.keys), "t._valid_from = s._valid_from"]
    )
    columns = [*plan.keys, *plan.values, *HISTORY_METADATA[:-1]]
    assignments: dict[str, str | Column] = {_q(c): f"s.{_q(c)}" for c in columns}
    assignments["_updated_at"] = "current_timestamp()"
    (
        target.alias("t")
        .merge(changes.alias("s"), on)
        .whenMatchedDelete(condition=f"s.{_ACTION} = 'delete'")
        .whenMatchedUpdate(set=assignments)
        .whenNotMatchedInsert(condition=f"s.{_ACTION} = 'upsert'", values=assignments)
        .execute()
    )

"""The silver stage's handling of Debezium's delivery (mixed into
:class:`pipelines.stages.silver.SilverStage`): the changes it re-sends, the TOAST values it does not
send, its truncates; the data-plane functions are :mod:`pipelines.silver.changes`'s."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.silver import changes
from pipelines.silver import history as history_state
from pipelines.spec import FlowSpec, SilverSpec

log = logging.getLogger("pipelines.stages.silver")


class SilverChanges:
    """Debezium's at-least-once delivery, for the stage that owns the state named here."""

    spec: FlowSpec
    silver: SilverSpec
    row_columns: tuple[str, ...]
    events_path: str
    current_path: str | None
    deleted_path: str | None
    #: The highest sequence the current table and its deleted keys hold, as this process wrote
    #: them (None: not known yet). See :func:`pipelines.silver.changes.without_redelivered`.
    _stored: changes.Stored | None = None

    def _keys(self) -> tuple[str, ...]:
        """The columns identifying a row: the current table's keys, else the history's."""
        if self.silver.current is not None:
            return self.silver.current.keys
        return self.silver.history_keys if self.silver.history is not None else ()

    def _carry_unavailable(
        self, parsed: DataFrame, columns: Sequence[str], batch_id: int
    ) -> DataFrame:
        """``parsed`` with Debezium's unsent TOAST values (in ``columns``) carried forward (see
        :func:`pipelines.silver.changes.carry_unavailable`); refused (quarantined) without a key
        or with a transform."""
        if not self._keys():
            return changes.refuse_unavailable(parsed, changes.NO_KEY)
        if self.silver.transform is not None:
            return changes.refuse_unavailable(parsed, changes.TRANSFORMED)
        stored = parsed.sparkSession.read.format("delta").load(self.events_path)
        return changes.carry_unavailable(parsed, stored, self._keys(), columns, batch_id)

    def _without_redelivered(self, events: DataFrame, total: int, batch_id: int) -> changes.Kept:
        """The batch's events without the changes Debezium delivered again, held, their number
        and the frames to release (see :func:`pipelines.silver.changes.without_redelivered`)."""
        spark = events.sparkSession
        keys = self._keys()
        stored_sequences = None
        if self.current_path is not None and self.deleted_path is not None:
            stored_sequences = (
                spark.read.format("delta").load(self.current_path).select(*keys, "_sequence")
            ).unionByName(
                spark.read.format("delta").load(self.deleted_path).select(*keys, "_sequence")
            )
        values = [c for c in self.row_columns if c not in keys]
        if self._stored is None and stored_sequences is not None:
            self._stored = self._highest_stored(events, stored_sequences)
        kept = changes.without_redelivered(
            events,
            spark.read.format("delta").load(self.events_path),
            stored_sequences,
            keys,
            values,
            batch_id,
            self._stored,
        )
        # Raised before the batch writes: a batch run again after a failure is looked up.
        self._stored = self._stored.after(kept.highest) if self._stored is not None else None
        count = kept.count
        if count < total:
            log.warning(
                "flow %s: silver batch %d: %d of its %d changes were delivered again by the "
                "connector (same key, LSN and op, or the same snapshot read): stored once",
                self.spec.name,
                batch_id,
                total - count,
                total,
            )
        return kept

    @staticmethod
    def _highest_stored(events: DataFrame, stored_sequences: DataFrame) -> changes.Stored | None:
        """What the tables hold, read once per process (a scan of one column). Only this
        process adds changes to them while it holds the flow's lease (a full refresh is a run of
        its own, under the lease; maintenance only rewrites files), so from then on it keeps the
        figure itself (:meth:`pipelines.silver.changes.Stored.after`)."""
        if not changes.ordered_in_python(events):
            return None
        row = stored_sequences.agg(F.max("_sequence")).first()
        return changes.Stored(row[0] if row is not None else None)

    def _truncates(self, in_batch: bool) -> history_state.Truncates:
        if self.silver.format != "debezium" or self.silver.debezium.truncate != "apply":
            return history_state.Truncates.NONE
        return history_state.Truncates.IN_BATCH if in_batch else history_state.Truncates.STORED

"""Conflux's watermark of a gold stage, kept with the split query's checkpoint.

The watermark that batch ``n`` of the split query judges its rows by is
``max(event time of the rows of batches < n) - allowed_lateness`` (late rows included: they are
older anyway; quarantined rows excluded). After batch ``n`` has split its rows, it records the
new maximum in ``<split checkpoint>/conflux_watermark/<n>.json`` before its Spark commit. Batch
``n`` reads the record of the greatest batch below ``n``, so a batch replayed after a crash (same
id, same rows) is judged by the very watermark of its first attempt and records the same value
again: the split is deterministic, and the watermark survives restarts with the checkpoint
(``conflux reset`` moves both aside together).

Spark's own watermark in the stateful query is ``max(event time it has seen) - allowed_lateness``
over the on-time rows only, which the split query has all seen in earlier batches: it is never
above Conflux's. So every row Spark would drop as late was split off first. (A join's stateful
query reads its input through two sources, which can be one split commit apart when both
queries run at once: :mod:`pipelines.gold.joins` says how the split keeps a margin for that.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipelines.catalog.state import write_json_atomically
from pipelines.location import Location

#: Records kept behind the newest one (a replay reads only the one before it).
KEEP_RECORDS = 20


def micros_column(micros: int | None) -> Column:
    """A timestamp literal of ``micros`` (null for None)."""
    if micros is None:
        return F.lit(None).cast("timestamp")
    return F.timestamp_micros(F.lit(micros))


def micros_to_iso(micros: int | None) -> str | None:
    if micros is None:
        return None
    return datetime.fromtimestamp(micros / 1_000_000, UTC).isoformat()


#: The side of a gold table that reads one input (windowed aggregates).
EVENTS = "events"


@dataclass(frozen=True)
class WatermarkRecord:
    batch_id: int
    #: The greatest event time of each side seen so far (None: none yet).
    max_by_side: Mapping[str, int | None]
    watermark_micros: int | None

    @property
    def max_event_micros(self) -> int | None:
        known = [m for m in self.max_by_side.values() if m is not None]
        return max(known) if known else None


class WatermarkLog:
    """The records of one split query (see the module doc).

    A split that reads several inputs (the two sides of a join) keeps each side's maximum; its
    watermark is the least of the sides' (``max - allowed_lateness``), as Spark's global
    watermark is the least of its watermark operators', and it has none until every side has
    had a row (Spark's stays at the epoch until then)."""

    def __init__(
        self, folder: Location, allowed_lateness_seconds: int, sides: Sequence[str] = (EVENTS,)
    ) -> None:
        """``folder``: the split's watermark log (:meth:`pipelines.catalog.state.FlowState.watermark_log`)."""
        self.folder = folder
        self.lateness_micros = allowed_lateness_seconds * 1_000_000
        self.sides = tuple(sides)

    def _batches(self) -> list[int]:
        stems = [
            name.removesuffix(".json") for name in self.folder.names() if name.endswith(".json")
        ]
        return sorted(int(stem) for stem in stems if stem.isdigit())

    def _read(self, batch_id: int) -> WatermarkRecord:
        data = json.loads((self.folder / f"{batch_id}.json").read_text())
        maxima = data.get("max_by_side") or {EVENTS: data["max_event_micros"]}
        return WatermarkRecord(batch_id, maxima, data["watermark_micros"])

    def before(self, batch_id: int) -> WatermarkRecord | None:
        """The record batch ``batch_id`` is judged by: that of the greatest batch below it."""
        earlier = [b for b in self._batches() if b < batch_id]
        return self._read(earlier[-1]) if earlier else None

    def latest(self) -> WatermarkRecord | None:
        batches = self._batches()
        return self._read(batches[-1]) if batches else None

    def record(self, batch_id: int, batch_max: Mapping[str, int | None]) -> WatermarkRecord:
        """Record the maxima after batch ``batch_id``, given the greatest event time of its own
        rows on each side."""
        previous = self.before(batch_id)
        maxima: dict[str, int | None] = {}
        for side in self.sides:
            earlier = previous.max_by_side.get(side) if previous is not None else None
            known = [m for m in (earlier, batch_max.get(side)) if m is not None]
            maxima[side] = max(known) if known else None
        seen = [m for m in maxima.values() if m is not None]
        watermark = min(seen) - self.lateness_micros if seen and len(seen) == len(maxima) else None
        record = WatermarkRecord(batch_id, maxima, watermark)
        write_json_atomically(
            self.folder / f"{batch_id}.json",
            {
                "max_event_micros": record.max_event_micros,
                "max_by_side": maxima,
                "watermark_micros": watermark,
                "max_event_time": micros_to_iso(record.max_event_micros),
                "watermark": micros_to_iso(watermark),
            },
        )
        for old in self._batches()[:-KEEP_RECORDS]:
            (self.folder / f"{old}.json").unlink(missing_ok=True)
            (self.folder / "decisions" / f"{old}.json").unlink(missing_ok=True)
        return record

    def decision(self, batch_id: int, decide: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """How batch ``batch_id`` judges its rows: ``decide()`` on its first attempt, recorded
        before it writes anything, and the recorded decision on a replay (so a replay splits the
        rows as the first attempt did, whatever changed in between)."""
        path = self.folder / "decisions" / f"{batch_id}.json"
        if path.exists():
            recorded: dict[str, Any] = json.loads(path.read_text())
            return recorded
        decided = decide()
        encoded = json.dumps(decided, default=str, indent=2, sort_keys=True).encode()
        if not path.create(encoded):  # another attempt recorded its decision first: that one holds
            recorded = json.loads(path.read_text())
            return recorded
        return decided

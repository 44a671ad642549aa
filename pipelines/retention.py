"""How long VACUUM must keep removed files: the slowest reader's need (see
:mod:`pipelines.maintenance`, whose module doc explains the rule), and which tables a flow has.

Split from :mod:`pipelines.maintenance` (the commands and the report); re-exported there.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pipelines.catalog.roles import TableRole, gold_stage
from pipelines.catalog.tables import CatalogTable, FlowCatalog
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

#: Added to the age of the oldest version a stream still reads: covers the time between the
#: computation and VACUUM's own clock reading, and clock skew between the stream's host and ours.
STREAM_MARGIN = timedelta(hours=1)
COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_DURATION_PART = re.compile(
    r"(\d+(?:\.\d+)?)\s*(millisecond|msec|ms|second|sec|s|minute|min|m|hour|h|day|d|week|w)s?\b",
    re.IGNORECASE,
)
_UNIT_SECONDS = {
    "millisecond": 0.001,
    "msec": 0.001,
    "ms": 0.001,
    "second": 1,
    "sec": 1,
    "s": 1,
    "minute": 60,
    "min": 60,
    "m": 60,
    "hour": 3600,
    "h": 3600,
    "day": 86400,
    "d": 86400,
    "week": 604800,
    "w": 604800,
}


# --- what to maintain -----------------------------------------------------------------------------


def flow_tables(spec: FlowSpec, settings: Settings) -> list[CatalogTable]:
    """Every table the flow writes, bronze first, each followed by its side tables."""
    return list(FlowCatalog.of(spec, settings))


@dataclass(frozen=True)
class StreamReader:
    """A streaming query of the flow that reads one of the flow's tables as a Delta source."""

    query: str
    #: The table it reads (:attr:`CatalogTable.id`).
    reads: str
    checkpoint: Location


def stream_readers(spec: FlowSpec, settings: Settings) -> list[StreamReader]:
    """The flow's own Delta-source streams: the silver stage's query over bronze, if it has one.

    ``chaining: bronze_batch`` writes silver inside bronze's micro-batch: no stream reads bronze.
    """
    silver = spec.silver
    catalog = FlowCatalog.of(spec, settings)
    state = catalog.state
    readers = []
    if silver is not None and silver.own_query:
        bronze = catalog.table(TableRole.BRONZE).id
        readers.append(StreamReader(f"{spec.name}.silver", bronze, state.silver_checkpoint))
    events = catalog.find(TableRole.EVENTS)
    for gold in spec.gold:
        assert events is not None, "validated: gold reads the silver events"
        split, aggregate = gold_stage(gold.table, split=True), gold_stage(gold.table)
        gold_input = catalog.table(TableRole.GOLD_INPUT, gold.table)
        readers += [
            StreamReader(f"{spec.name}.{split}", events.id, state.stage_checkpoint(split)),
            StreamReader(
                f"{spec.name}.{aggregate}", gold_input.id, state.stage_checkpoint(aggregate)
            ),
        ]
    return readers


# --- how long to keep removed files ---------------------------------------------------------------


def parse_duration(text: str) -> timedelta | None:
    """A spec retention (``7 days``) or a Delta interval (``interval 2 weeks 3 days``); None when
    the text is not one (Delta validates its own properties when they are set)."""
    body = re.sub(r"^\s*interval\s+", "", text.strip(), flags=re.IGNORECASE)
    parts = list(_DURATION_PART.finditer(body))
    if not parts or _DURATION_PART.sub("", body).strip():
        return None
    seconds = sum(float(p[1]) * _UNIT_SECONDS[p[2].lower()] for p in parts)
    return timedelta(seconds=seconds)


def _offset_version(offset_file: Location) -> int | None:
    """``reservoirVersion`` of a Delta source in one ``offsets/<n>`` file (None: not a Delta one).

    The file is ``v1``, the batch metadata, then one JSON line per source.
    """
    for line in offset_file.read_text().splitlines()[1:]:
        if not line.startswith("{"):
            continue
        offset = json.loads(line)
        if "reservoirVersion" in offset:
            return int(offset["reservoirVersion"])
    return None


def _numbered(folder: Location) -> list[int]:
    return sorted(int(name) for name in folder.names() if name.isdigit())


def stream_start_version(checkpoint: Location) -> int | None:
    """The source table version a Delta-source stream restarts from; None if it never planned
    a batch.

    ``offsets/<n>`` holds where batch n *ends*; batch n starts where the last committed batch
    (``commits/<m>``) ended. So the stream needs the versions from ``offsets/<m>`` on, or, before
    its first commit, from its first batch's offsets (a first batch reads the snapshot of that
    version). Read-only: the checkpoint is the stream's.
    """
    offsets = _numbered(checkpoint / "offsets")
    if not offsets:
        return None
    committed = [b for b in _numbered(checkpoint / "commits") if b in offsets]
    batches = [committed[-1]] if committed else offsets[:1]
    versions = [_offset_version(checkpoint / "offsets" / str(b)) for b in batches]
    known = [v for v in versions if v is not None]
    return min(known) if known else None


def latest_version(table: Location) -> int:
    """The newest version with a commit file in ``table``'s log (-1 if none)."""
    names = (table / "_delta_log").names()
    return max((int(m[1]) for name in names if (m := COMMIT_FILE.match(name))), default=-1)


class UndatedVersionError(Exception):
    """A version a stream needs whose commit cannot be dated (its log entry is gone)."""


def commit_time(table: Location, version: int) -> datetime | None:
    """When ``version`` of ``table`` was committed; None if it is not committed yet (a stream
    that has read everything points at the next version).

    From the commit's ``commitInfo`` (``inCommitTimestamp``, else ``timestamp``), else the commit
    file's modification time.

    Raises:
        UndatedVersionError: the version is committed but its commit file is gone.
    """
    commit = table / "_delta_log" / f"{version:020d}.json"
    if not commit.exists():
        if version > latest_version(table):
            return None
        raise UndatedVersionError(f"{commit} is gone (Delta's log retention removed it)")
    for line in commit.read_text().splitlines():
        action = json.loads(line)
        info = action.get("commitInfo")
        if info is not None:
            millis = info.get("inCommitTimestamp", info.get("timestamp"))
            if millis is not None:
                return datetime.fromtimestamp(int(millis) / 1000, UTC)
    if not commit.is_local:  # Delta writes commitInfo; only a foreign writer's commit lacks it
        raise UndatedVersionError(f"{commit} records no commit time")
    return datetime.fromtimestamp(commit.path.stat().st_mtime, UTC)


@dataclass(frozen=True)
class StreamNeed:
    """The oldest version of a table that a stream still reads, and when it was committed."""

    query: str
    version: int
    committed_at: datetime | None  # None: not committed yet, the stream needs nothing older


def stream_needs(readers: Sequence[StreamReader], table: CatalogTable) -> list[StreamNeed]:
    """What the readers of ``table`` still need.

    Raises:
        UndatedVersionError: a reader needs a version whose commit cannot be dated.
    """
    needs = []
    for reader in readers:
        if reader.reads != table.id:
            continue
        version = stream_start_version(reader.checkpoint)
        if version is not None:
            needs.append(StreamNeed(reader.query, version, commit_time(table.path, version)))
    return needs


@dataclass(frozen=True)
class Retention:
    """The VACUUM retention of one table and why it is that long."""

    hours: int
    reason: str


def _hours(duration: timedelta) -> int:
    """Whole hours, rounded up (VACUUM rounds a fractional RETAIN to the nearest hour)."""
    return max(0, math.ceil(duration.total_seconds() / 3600))


def _age(duration: timedelta) -> str:
    hours = duration.total_seconds() / 3600
    return f"{hours / 24:.1f} days" if hours >= 48 else f"{hours:.1f} hours"


def vacuum_retention(
    declared: str,
    table_default: str | None,
    needs: Sequence[StreamNeed],
    now: datetime,
) -> Retention:
    """The longest of: the spec's ``vacuum_retention``, the table's
    ``delta.deletedFileRetentionDuration`` and each stream's need (age of the oldest version it
    still reads, plus :data:`STREAM_MARGIN`)."""
    declared_duration = parse_duration(declared)
    assert declared_duration is not None, f"validated by the spec: {declared!r}"
    retention = Retention(_hours(declared_duration), f"maintenance.vacuum_retention {declared}")
    own = parse_duration(table_default) if table_default else None
    if own is not None and _hours(own) > retention.hours:
        retention = Retention(
            _hours(own), f"the table's deletedFileRetentionDuration {table_default}"
        )
    for need in needs:
        if need.committed_at is None:
            continue
        age = now - need.committed_at
        hours = _hours(age + STREAM_MARGIN)
        if hours > retention.hours:
            retention = Retention(
                hours,
                f"stream {need.query} still reads version {need.version}, committed "
                f"{_age(age)} ago (+{_age(STREAM_MARGIN)} margin)",
            )
    return retention

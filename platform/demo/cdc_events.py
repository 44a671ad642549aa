"""Deterministic Debezium change events for a ``customers`` table, and what silver must make of them.

Shared by the demo (``produce_sample.py``, beside this file) and the tests (``tests/support/cdc.py``
imports this file by path: ``platform/`` is deliberately not a package). Pure Python, no Kafka.

* :func:`generate_events`: inserts, updates, deletes and re-creates (an insert after a delete) for
  ``keys`` customers, in commit order: every event has a strictly increasing ``source.lsn``. The
  events of one key are close together (a small pool of keys is active at a time), so a bounded
  shuffle does reorder them. Every delete is followed by a tombstone, as Debezium sends it.
* :func:`delivery_order`: what a consumer sees: every record moved at most ``window`` positions,
  and a fraction of the change events delivered twice (at-least-once).
* :func:`expected_current_state`: the reference model of the current-state table: per key the
  event with the highest lsn wins, whatever the arrival order; a delete removes the key.
* :func:`bad_records`: records silver must quarantine, each with the reason it should give.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: The row schema of the captured table, as the flow spec declares it.
SCHEMA_DDL = "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP"
COLUMNS = ("id", "name", "email", "tier", "updated_at")
DATABASE, TABLE = "shop", "customers"
#: Debezium ops of change events: create, update, delete, read (snapshot).
OPS = ("c", "u", "d", "r")
TIERS = ("free", "silver", "gold", "platinum")
FIRST_NAMES = ("ada", "alan", "grace", "edsger", "barbara", "donald", "frances", "ken", "radia")
LAST_NAMES = ("lovelace", "turing", "hopper", "dijkstra", "liskov", "knuth", "allen", "thompson")
#: 2026-01-01T00:00:00Z: the first event's source.ts_ms (fixed, so a seed gives the same bytes).
BASE_TS_MS = 1_767_225_600_000
#: The first event's source.lsn (a Postgres LSN is a byte position in the WAL: it grows unevenly).
FIRST_LSN = 23_803_712

Row = dict[str, Any]


def iso_timestamp(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with a ``Z``: ``2026-01-01T00:00:00.250Z``."""
    text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    """The inverse of :func:`iso_timestamp`: an aware UTC datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def key_bytes(key: int) -> bytes:
    """The Kafka key Debezium writes for a row: the primary key as JSON."""
    return json.dumps({"id": key}).encode()


def partition_for(key: bytes | None, partitions: int) -> int:
    """A stable partition for ``key`` (CRC32): one key always lands in one partition."""
    return 0 if key is None else zlib.crc32(key) % partitions


@dataclass(frozen=True)
class ChangeEvent:
    """One Debezium record of the ``customers`` table: a change event, or a tombstone.

    ``op`` is None for a tombstone (Kafka value null, sent right after a delete for log
    compaction); its ``lsn`` and times are the delete's, kept only to place it, never sent.
    """

    id: int
    op: str | None
    lsn: int
    before: Row | None = None
    after: Row | None = None
    source_ts_ms: int = BASE_TS_MS
    ts_ms: int = BASE_TS_MS

    @property
    def tombstone(self) -> bool:
        return self.op is None

    def envelope(self) -> dict[str, Any] | None:
        """The JSON value Debezium writes (``schemas.enable=false``); None for a tombstone."""
        if self.tombstone:
            return None
        return {
            "before": self.before,
            "after": self.after,
            "op": self.op,
            "ts_ms": self.ts_ms,
            "source": {
                "ts_ms": self.source_ts_ms,
                "lsn": self.lsn,
                "db": DATABASE,
                "table": TABLE,
            },
        }

    def key(self) -> bytes:
        return key_bytes(self.id)

    def value(self) -> bytes | None:
        envelope = self.envelope()
        return None if envelope is None else json.dumps(envelope).encode()

    def record(self) -> tuple[bytes, bytes | None]:
        """The Kafka (key, value) of this record."""
        return self.key(), self.value()


def _new_row(key: int, ts_ms: int, rng: random.Random) -> Row:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {
        "id": key,
        "name": f"{first.title()} {last.title()}",
        "email": f"{first}.{last}.{key}@example.com",
        "tier": rng.choice(TIERS),
        "updated_at": iso_timestamp(ts_ms),
    }


def _updated_row(row: Row, ts_ms: int, rng: random.Random) -> Row:
    changed = dict(row, updated_at=iso_timestamp(ts_ms))
    for column in rng.sample(("name", "email", "tier"), rng.randint(1, 2)):
        if column == "tier":
            changed["tier"] = rng.choice([t for t in TIERS if t != row["tier"]])
        elif column == "email":
            changed["email"] = (
                f"{rng.choice(FIRST_NAMES)}.{row['id']}.{rng.randint(0, 999)}@example.org"
            )
        else:
            changed["name"] = f"{rng.choice(FIRST_NAMES).title()} {rng.choice(LAST_NAMES).title()}"
    return changed


def generate_events(
    keys: int,
    seed: int,
    *,
    first_id: int = 1,
    max_events_per_key: int = 6,
    delete_probability: float = 0.25,
    snapshot_fraction: float = 0.1,
    active_keys: int = 16,
    first_lsn: int = FIRST_LSN,
    first_ts_ms: int = BASE_TS_MS,
) -> list[ChangeEvent]:
    """Change events of ``keys`` customers (ids ``first_id`` on), in commit (lsn) order.

    Each key gets 1..``max_events_per_key`` events. Its first is an insert (``c``, or ``r`` for a
    ``snapshot_fraction`` of keys); after that a live row is updated or, with
    ``delete_probability``, deleted, and a deleted one is created again. Keys are drawn from a pool
    of ``active_keys`` at a time, so one key's events are about ``active_keys`` positions apart.
    Every delete is followed by its tombstone. Same arguments, same events. The lsns are above
    ``first_lsn``, the commit times (``source.ts_ms``) from ``first_ts_ms`` on.
    """
    rng = random.Random(seed)
    order = list(range(first_id, first_id + keys))
    rng.shuffle(order)
    plan = {key: rng.randint(1, max_events_per_key) for key in order}
    rows: dict[int, Row | None] = {}  # absent: never seen; None: deleted
    pool: list[int] = []
    waiting = iter(order)
    events: list[ChangeEvent] = []
    lsn, ts_ms = first_lsn, first_ts_ms
    while True:
        while len(pool) < active_keys and (key := next(waiting, None)) is not None:
            pool.append(key)
        if not pool:
            return events
        key = rng.choice(pool)
        lsn += 8 * rng.randint(1, 64)
        ts_ms += rng.randint(0, 20)  # ties happen: ts_ms cannot order events, the lsn can
        commit = {"lsn": lsn, "source_ts_ms": ts_ms, "ts_ms": ts_ms + rng.randint(5, 500)}
        row = rows.get(key)
        if key not in rows:
            op = "r" if rng.random() < snapshot_fraction else "c"
            rows[key] = _new_row(key, ts_ms, rng)
            events.append(ChangeEvent(key, op, after=rows[key], **commit))
        elif row is None:  # a re-create
            rows[key] = _new_row(key, ts_ms, rng)
            events.append(ChangeEvent(key, "c", after=rows[key], **commit))
        elif rng.random() < delete_probability:
            rows[key] = None
            events.append(ChangeEvent(key, "d", before=row, **commit))
            events.append(ChangeEvent(key, None, **commit))  # its tombstone
        else:
            rows[key] = _updated_row(row, ts_ms, rng)
            events.append(ChangeEvent(key, "u", before=row, after=rows[key], **commit))
        plan[key] -= 1
        if plan[key] == 0:
            pool.remove(key)


def delivery_order(
    events: Sequence[ChangeEvent],
    seed: int,
    *,
    window: int = 50,
    duplicate_fraction: float = 0.05,
) -> list[ChangeEvent]:
    """``events`` as a consumer may see them: shuffled within ``window`` positions, some twice.

    Record ``i`` is placed by the sort key ``i + uniform(0, window)``, so no record moves more than
    ``window`` positions. ``round(duplicate_fraction * change events)`` change events (never
    tombstones) are delivered a second time, placed the same way, independently.
    """
    rng = random.Random(seed)
    placed = [(i + rng.uniform(0, window), i, event) for i, event in enumerate(events)]
    changes = [i for i, event in enumerate(events) if not event.tombstone]
    duplicates = rng.sample(changes, round(duplicate_fraction * len(changes)))
    placed += [(i + rng.uniform(0, window), i, events[i]) for i in sorted(duplicates)]
    placed.sort(key=lambda entry: (entry[0], entry[1]))
    return [event for _position, _index, event in placed]


def expected_current_state(events: Iterable[ChangeEvent]) -> dict[int, Row]:
    """The current-state table ``events`` must give, whatever order they arrived in.

    Per key, the change event with the highest lsn wins: an insert, update or snapshot read
    leaves its after image, a delete leaves no row (even if an insert with a lower lsn arrives
    after it). Tombstones carry nothing and are ignored; a duplicate changes nothing.
    """
    latest: dict[int, ChangeEvent] = {}
    for event in events:
        if event.tombstone:
            continue
        current = latest.get(event.id)
        if current is None or event.lsn > current.lsn:
            latest[event.id] = event
    return {
        key: dict(event.after)
        for key, event in sorted(latest.items())
        if event.op != "d" and event.after is not None
    }


def expected_history(
    events: Iterable[ChangeEvent], tracked: Sequence[str] = ("name", "email", "tier")
) -> dict[int, list[Row]]:
    """The history (SCD type 2) table ``events`` must give, whatever order they arrived in.

    Per key, its distinct change events in lsn order (a delete after an upsert of the same lsn):
    an upsert whose ``tracked`` columns differ from the open version's (or that follows a delete)
    closes the open version at its lsn and opens a new one; any other upsert updates the open
    version's values in place; a delete closes the open version. Each version is its row with
    ``_valid_from`` and ``_valid_to`` (None while open), ordered by ``_valid_from``.
    """
    changes: dict[int, dict[tuple[int, bool], ChangeEvent]] = {}
    for event in events:
        if not event.tombstone:
            changes.setdefault(event.id, {})[(event.lsn, event.op == "d")] = event
    history: dict[int, list[Row]] = {}
    for key, by_order in sorted(changes.items()):
        versions: list[Row] = []
        open_version: Row | None = None
        for (lsn, is_delete), event in sorted(by_order.items()):
            if is_delete or event.after is None:
                if open_version is not None:
                    versions.append({**open_version, "_valid_to": lsn})
                    open_version = None
                continue
            state = [event.after[c] for c in tracked]
            if open_version is not None and state == [open_version[c] for c in tracked]:
                open_version.update(event.after)
                continue
            if open_version is not None:
                versions.append({**open_version, "_valid_to": lsn})
            open_version = {**event.after, "_valid_from": lsn, "_valid_to": None}
        if open_version is not None:
            versions.append(open_version)
        if versions:
            history[key] = versions
    return history


def apply_in_arrival_order(events: Iterable[ChangeEvent]) -> dict[int, Row]:
    """What a naive consumer gets by applying every event as it arrives (last one wins).

    Not the model: tests use it to show a delivery order really needs the lsn to be applied right.
    """
    state: dict[int, Row] = {}
    for event in events:
        if event.tombstone:
            continue
        if event.op == "d":
            state.pop(event.id, None)
        elif event.after is not None:
            state[event.id] = dict(event.after)
    return dict(sorted(state.items()))


def records(events: Iterable[ChangeEvent]) -> list[tuple[bytes, bytes | None]]:
    """The Kafka (key, value) records of ``events``, in their order."""
    return [event.record() for event in events]


@dataclass(frozen=True)
class BadRecord:
    """A record silver must quarantine: ``reason`` is a substring of the reason it must give."""

    name: str
    key: bytes | None
    value: bytes
    reason: str

    def record(self) -> tuple[bytes | None, bytes]:
        return self.key, self.value


def bad_records(first_id: int = 1_000_000_000, lsn: int = 9_000_000_000) -> list[BadRecord]:
    """One record per way a Debezium payload can be wrong; ids from ``first_id``, unused elsewhere.

    The ones that parse carry an lsn above any :func:`generate_events` gives (``lsn`` on), so a
    silver stage that wrongly accepted one would show it in the current table.
    """

    def envelope(key: int, offset: int, *, op: str = "c", after: Row | None = None) -> dict:
        event = ChangeEvent(key, op, lsn + offset, after=after or _fixed_row(key))
        value = event.envelope()
        assert value is not None
        return value

    null_lsn = envelope(first_id + 4, 4)
    null_lsn["source"]["lsn"] = None
    no_key = envelope(first_id + 5, 5)
    del no_key["after"]["id"]
    wrong_type = envelope(first_id + 6, 6)
    wrong_type["after"]["id"] = "abc"
    truncated = json.dumps(envelope(first_id + 1, 1)).encode()
    return [
        BadRecord("not-utf8", key_bytes(first_id), b"\xff\xfe\xfa not utf-8", "not valid UTF-8"),
        BadRecord(
            "truncated-json", key_bytes(first_id + 1), truncated[: len(truncated) // 2],
            "not valid JSON",
        ),
        BadRecord(
            "json-array", key_bytes(first_id + 2), json.dumps([envelope(first_id + 2, 2)]).encode(),
            "not a JSON object",
        ),
        BadRecord(
            "unknown-op", key_bytes(first_id + 3),
            json.dumps(envelope(first_id + 3, 3, op="x")).encode(), "unknown Debezium op",
        ),
        BadRecord("null-lsn", key_bytes(first_id + 4), json.dumps(null_lsn).encode(), "sequence"),
        BadRecord("missing-key", None, json.dumps(no_key).encode(), "key"),
        BadRecord(
            "type-mismatch", None, json.dumps(wrong_type).encode(),
            "does not match the declared schema",
        ),
    ]  # fmt: skip


def expectation_breakers(
    first_id: int = 1_100_000_000, lsn: int = 9_100_000_000
) -> list[BadRecord]:
    """Well-formed changes that the demo flow's expectations (``flows/customers.yaml``) judge:
    an unknown tier (``known_tier``, action drop: quarantined) and an email without ``@``
    (``email_has_at``, action warn: kept, counted)."""

    return [
        BadRecord(
            "unknown-tier", key_bytes(first_id), _created(first_id, lsn, tier="vip"),
            "expectation known_tier failed",
        ),
        BadRecord(
            "email-without-at", key_bytes(first_id + 1),
            _created(first_id + 1, lsn + 1, email="n/a"), "",
        ),
    ]  # fmt: skip


def schema_breakers(first_id: int = 1_200_000_000, lsn: int = 9_200_000_000) -> list[BadRecord]:
    """Changes as a source whose table changed would send them: one whose ``updated_at`` is no
    longer a timestamp (a type change: quarantined, the ``schema_changes`` check warns) and one
    with a column added upstream (``loyalty_points``: evolved into the silver tables)."""

    return [
        BadRecord(
            "type-change", key_bytes(first_id), _created(first_id, lsn, updated_at="last tuesday"),
            "value does not match the declared schema: after.updated_at (timestamp)",
        ),
        BadRecord(
            "column-added", key_bytes(first_id + 1),
            _created(first_id + 1, lsn + 1, loyalty_points=120), "",
        ),
    ]  # fmt: skip


def _created(key: int, lsn: int, **values: Any) -> bytes:
    """A create of ``key`` at ``lsn`` with a fixed row, ``values`` changed or added."""
    event = ChangeEvent(key, "c", lsn, after={**_fixed_row(key), **values})
    return json.dumps(event.envelope()).encode()


def _fixed_row(key: int) -> Row:
    return {
        "id": key,
        "name": "Bad Record",
        "email": f"bad.{key}@example.com",
        "tier": "free",
        "updated_at": iso_timestamp(BASE_TS_MS),
    }


def mix_in(
    stream: Sequence[tuple[bytes | None, bytes | None]],
    extra: Iterable[tuple[bytes | None, bytes | None]],
    seed: int,
) -> list[tuple[bytes | None, bytes | None]]:
    """``stream`` with the ``extra`` records at seeded random places, both in their own order."""
    rng = random.Random(seed)
    extra = list(extra)
    places = sorted(rng.randint(0, len(stream)) for _ in extra)
    mixed: list[tuple[bytes | None, bytes | None]] = []
    start = 0
    for place, record in zip(places, extra, strict=True):
        mixed += stream[start:place]
        mixed.append(record)
        start = place
    return mixed + list(stream[start:])

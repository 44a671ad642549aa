"""The Debezium change-stream generator and the reference model that silver tests compare against.

A silver test is only as good as these: the stream must really reorder and duplicate one key's
events (or the test proves nothing about ordering), and the model must not depend on the order.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from itertools import pairwise

import pytest

from tests.support.cdc import (
    COLUMNS,
    SCHEMA_DDL,
    ChangeEvent,
    apply_in_arrival_order,
    bad_records,
    by_partition,
    delivered_changes,
    delivery_order,
    expected_current_state,
    generate_events,
    iso_timestamp,
    key_bytes,
    mix_in,
    parse_timestamp,
    partition_for,
    records,
    typed_row,
)

KEYS, SEED = 400, 11


@pytest.fixture(scope="module")
def events() -> list[ChangeEvent]:
    return generate_events(KEYS, SEED)


@pytest.fixture(scope="module")
def delivered(events: list[ChangeEvent]) -> list[ChangeEvent]:
    return delivery_order(events, SEED)


def changes(stream: list[ChangeEvent]) -> list[ChangeEvent]:
    return [e for e in stream if not e.tombstone]


def per_key(stream: list[ChangeEvent]) -> dict[int, list[int]]:
    lsns: dict[int, list[int]] = defaultdict(list)
    for event in changes(stream):
        lsns[event.id].append(event.lsn)
    return lsns


class TestGenerator:
    def test_same_seed_same_bytes_other_seed_other_stream(self, events: list[ChangeEvent]) -> None:
        again = generate_events(KEYS, SEED)
        assert records(again) == records(events)
        assert records(delivery_order(again, SEED)) == records(delivery_order(events, SEED))
        assert records(generate_events(KEYS, SEED + 1)) != records(events)
        assert records(delivery_order(events, SEED + 1)) != records(delivery_order(events, SEED))

    def test_lsn_strictly_increases_over_the_change_events(self, events: list[ChangeEvent]) -> None:
        lsns = [e.lsn for e in changes(events)]
        assert all(a < b for a, b in pairwise(lsns))
        timestamps = [e.source_ts_ms for e in changes(events)]
        assert timestamps == sorted(timestamps)
        assert len(set(timestamps)) < len(timestamps), "ties in ts_ms: only the lsn orders events"

    def test_every_key_has_events_and_all_kinds_of_change_occur(
        self, events: list[ChangeEvent]
    ) -> None:
        assert set(per_key(events)) == set(range(1, KEYS + 1))
        ops = Counter(e.op for e in events)
        assert set(ops) == {"c", "u", "d", "r", None}
        assert ops["d"] == ops[None], "every delete is followed by a tombstone"
        recreated = 0
        for key, history in self._histories(events).items():
            assert history[0] in ("c", "r"), key
            for previous, op in pairwise(history):
                assert (op == "c") == (previous == "d"), (key, history)  # create only after delete
            recreated += any(a == "d" and b == "c" for a, b in pairwise(history))
        assert recreated >= 10

    @staticmethod
    def _histories(events: list[ChangeEvent]) -> dict[int, list[str]]:
        histories: dict[int, list[str]] = defaultdict(list)
        for event in changes(events):
            histories[event.id].append(event.op)
        return histories

    def test_envelopes_look_like_debezium(self, events: list[ChangeEvent]) -> None:
        for event in events:
            key, value = event.record()
            assert json.loads(key) == {"id": event.id}
            if event.tombstone:
                assert value is None
                continue
            envelope = json.loads(value)
            assert set(envelope) == {"before", "after", "op", "ts_ms", "source"}
            assert envelope["source"] == {
                "ts_ms": event.source_ts_ms, "lsn": event.lsn, "db": "shop", "table": "customers",
            }  # fmt: skip
            assert envelope["ts_ms"] >= envelope["source"]["ts_ms"]
            image = envelope["before"] if event.op == "d" else envelope["after"]
            assert tuple(image) == COLUMNS
            assert image["id"] == event.id
            assert image["updated_at"].endswith("Z")
            assert (envelope["after"] is None) == (event.op == "d")
            assert (envelope["before"] is None) == (event.op in ("c", "r"))

    def test_each_delete_is_followed_by_its_tombstone(self, events: list[ChangeEvent]) -> None:
        for index, event in enumerate(events):
            if event.op == "d":
                tombstone = events[index + 1]
                assert tombstone.tombstone
                assert (tombstone.id, tombstone.lsn) == (event.id, event.lsn)

    def test_schema_ddl_names_the_columns(self) -> None:
        assert tuple(part.split()[0] for part in SCHEMA_DDL.split(", ")) == COLUMNS

    def test_timestamps_round_trip(self) -> None:
        text = iso_timestamp(1_767_225_600_250)
        assert text == "2026-01-01T00:00:00.250Z"
        assert parse_timestamp(text).isoformat() == "2026-01-01T00:00:00.250000+00:00"


class TestDeliveryOrder:
    def test_same_records_plus_duplicates_each_moved_at_most_the_window(
        self, events: list[ChangeEvent], delivered: list[ChangeEvent]
    ) -> None:
        sent = Counter(records(events))
        got = Counter(records(delivered))
        extra = got - sent
        assert got - extra == sent, "every record delivered"
        assert sum(extra.values()) == round(0.05 * len(changes(events)))
        assert max(extra.values()) == 1
        assert all(value is not None for _key, value in extra), "tombstones are not duplicated"
        # Delivered before means placed lower: i + u_i <= j + u_j, so i - j < window.
        position = {(e.lsn, e.tombstone): i for i, e in enumerate(events)}
        furthest = -1
        for event in delivered:
            index = position[(event.lsn, event.tombstone)]
            assert index > furthest - 50, (index, furthest)
            furthest = max(furthest, index)

    def test_one_keys_events_arrive_out_of_lsn_order_for_many_keys(
        self, delivered: list[ChangeEvent]
    ) -> None:
        disordered = [
            key for key, lsns in per_key(delivered).items() if any(a > b for a, b in pairwise(lsns))
        ]
        assert len(disordered) >= KEYS // 10, len(disordered)

    def test_a_delete_arrives_before_an_older_insert_of_its_key(
        self, delivered: list[ChangeEvent]
    ) -> None:
        """The case that needs remembered deletes: the insert arrives last and must lose."""
        seen_deletes: dict[int, int] = {}
        late_inserts = 0
        for event in changes(delivered):
            if event.op == "d":
                seen_deletes[event.id] = max(event.lsn, seen_deletes.get(event.id, 0))
            elif event.op in ("c", "r") and event.lsn < seen_deletes.get(event.id, -1):
                late_inserts += 1
        assert late_inserts >= 1

    def test_window_and_fraction_are_parameters(self, events: list[ChangeEvent]) -> None:
        in_order = delivery_order(events, SEED, window=0, duplicate_fraction=0.0)
        assert records(in_order) == records(events)
        doubled = delivery_order(events, SEED, window=0, duplicate_fraction=1.0)
        assert delivered_changes(doubled) == 2 * len(changes(events))


class TestModel:
    def test_order_independent(
        self, events: list[ChangeEvent], delivered: list[ChangeEvent]
    ) -> None:
        state = expected_current_state(events)
        assert expected_current_state(delivered) == state
        assert expected_current_state(reversed(delivered)) == state
        shuffled = list(delivered)
        random.Random(3).shuffle(shuffled)
        assert expected_current_state(shuffled) == state
        assert expected_current_state(sorted(delivered, key=lambda e: e.lsn)) == state

    def test_in_commit_order_it_is_plain_replay_and_the_shuffle_matters(
        self, events: list[ChangeEvent], delivered: list[ChangeEvent]
    ) -> None:
        state = expected_current_state(events)
        assert apply_in_arrival_order(events) == state
        assert apply_in_arrival_order(delivered) != state, "the delivery order must be a test"

    def test_last_event_per_key_decides(self, events: list[ChangeEvent]) -> None:
        state = expected_current_state(events)
        last = {e.id: e for e in changes(events)}
        assert set(state) == {key for key, e in last.items() if e.op != "d"}
        assert 0 < len(state) < KEYS
        for key, row in state.items():
            assert row == last[key].after
            assert row["id"] == key

    def test_a_delete_with_a_higher_lsn_wins_over_a_later_arriving_insert(self) -> None:
        row = {"id": 1, "name": "A", "email": "a@x", "tier": "free", "updated_at": "2026-01-01Z"}
        insert = ChangeEvent(1, "c", 10, after=row)
        delete = ChangeEvent(1, "d", 20, before=row)
        tombstone = ChangeEvent(1, None, 20)
        recreate = ChangeEvent(1, "c", 30, after={**row, "name": "B"})
        assert expected_current_state([delete, tombstone, insert]) == {}
        assert expected_current_state([recreate, delete, insert, insert]) == {
            1: {**row, "name": "B"}
        }
        assert expected_current_state([tombstone]) == {}

    def test_typed_row_is_what_delta_returns(self, events: list[ChangeEvent]) -> None:
        row = next(iter(expected_current_state(events).values()))
        typed = typed_row(row)
        assert typed["updated_at"] == parse_timestamp(row["updated_at"])
        assert typed["updated_at"].utcoffset().total_seconds() == 0


class TestBadRecords:
    def test_each_defect_once_with_its_reason(self) -> None:
        bad = bad_records()
        assert [b.name for b in bad] == [
            "not-utf8", "truncated-json", "json-array", "unknown-op", "null-lsn", "missing-key",
            "type-mismatch",
        ]  # fmt: skip
        reasons = {b.name: b.reason for b in bad}
        assert reasons["not-utf8"] == "not valid UTF-8"
        assert reasons["truncated-json"] == "not valid JSON"
        assert reasons["json-array"] == "not a JSON object"
        assert reasons["unknown-op"] == "unknown Debezium op"
        assert reasons["null-lsn"] == "sequence"
        assert reasons["missing-key"] == "key"
        assert reasons["type-mismatch"] == "does not match the declared schema"

    def test_each_record_has_exactly_its_defect(self) -> None:
        bad = {b.name: b.value for b in bad_records()}
        with pytest.raises(UnicodeDecodeError):
            bad["not-utf8"].decode("utf-8")
        with pytest.raises(json.JSONDecodeError):
            json.loads(bad["truncated-json"])
        assert isinstance(json.loads(bad["json-array"]), list)
        envelopes = {n: json.loads(v) for n, v in bad.items() if n not in ("not-utf8", "truncated-json", "json-array")}  # fmt: skip
        assert envelopes["unknown-op"]["op"] == "x"
        assert envelopes["null-lsn"]["source"]["lsn"] is None
        assert "id" not in envelopes["missing-key"]["after"]
        assert envelopes["type-mismatch"]["after"]["id"] == "abc"
        for name, envelope in envelopes.items():
            assert set(envelope) == {"before", "after", "op", "ts_ms", "source"}, name
            if name != "null-lsn":
                assert isinstance(envelope["source"]["lsn"], int)
            if name != "unknown-op":
                assert envelope["op"] == "c", name

    def test_bad_ids_and_lsns_stay_clear_of_generated_ones(self, events: list[ChangeEvent]) -> None:
        top = max(e.lsn for e in events)
        for record in bad_records():
            try:
                envelope = json.loads(record.value)
            except ValueError:
                continue
            if isinstance(envelope, dict) and envelope["source"]["lsn"] is not None:
                assert envelope["source"]["lsn"] > top
                assert envelope["after"].get("id") not in range(1, KEYS + 1)

    def test_mix_in_keeps_both_streams_in_order(self, delivered: list[ChangeEvent]) -> None:
        stream = records(delivered)
        extra = [b.record() for b in bad_records()]
        mixed = mix_in(stream, extra, seed=5)
        assert len(mixed) == len(stream) + len(extra)
        assert [r for r in mixed if r in extra] == extra
        assert [r for r in mixed if r not in extra] == stream
        assert mix_in(stream, extra, seed=5) == mixed


class TestPartitioning:
    def test_one_key_one_partition_in_stream_order(self, delivered: list[ChangeEvent]) -> None:
        stream = records(delivered)
        split = by_partition(stream, 3)
        assert sorted(split) == [0, 1, 2]
        assert sum(len(part) for part in split.values()) == len(stream)
        homes: dict[bytes | None, set[int]] = defaultdict(set)
        for partition, part in split.items():
            for key, _value in part:
                homes[key].add(partition)
            assert part == [r for r in stream if partition_for(r[0], 3) == partition]
        assert all(len(partitions) == 1 for partitions in homes.values())
        assert partition_for(key_bytes(7), 3) == partition_for(key_bytes(7), 3)
        assert partition_for(None, 3) == 0

"""Debezium change streams for silver tests: the generator and reference model, and producing them.

The generator and the model live in ``platform/demo/cdc_events.py``, shared with the demo (which
must not import ``tests/``); this module imports that file by path (``platform/`` is deliberately
not a package) and re-exports it, adding what needs a broker: producing a stream to Kafka with one
key always in one partition, so the shuffle of :func:`delivery_order` is what a partition holds.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import defaultdict
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from pipelines.settings import PROJECT_ROOT
from tests.support.kafka import create_topic, produce

CDC_EVENTS_FILE = PROJECT_ROOT / "platform" / "demo" / "cdc_events.py"


def _load() -> ModuleType:
    name = "conflux_demo_cdc_events"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CDC_EVENTS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


_cdc = _load()

SCHEMA_DDL: str = _cdc.SCHEMA_DDL
COLUMNS: tuple[str, ...] = _cdc.COLUMNS
OPS: tuple[str, ...] = _cdc.OPS
ChangeEvent = _cdc.ChangeEvent
BadRecord = _cdc.BadRecord
Row = dict[str, Any]
generate_events = _cdc.generate_events
delivery_order = _cdc.delivery_order
expected_current_state = _cdc.expected_current_state
expected_history = _cdc.expected_history
apply_in_arrival_order = _cdc.apply_in_arrival_order
records = _cdc.records
bad_records = _cdc.bad_records
expectation_breakers = _cdc.expectation_breakers
schema_breakers = _cdc.schema_breakers
mix_in = _cdc.mix_in
key_bytes = _cdc.key_bytes
partition_for = _cdc.partition_for
iso_timestamp = _cdc.iso_timestamp
parse_timestamp = _cdc.parse_timestamp

KafkaRecord = tuple[bytes | None, bytes | None]


def typed_row(row: Row) -> Row:
    """A model row as a Delta reader returns it: ``updated_at`` an aware UTC datetime."""
    updated_at = row["updated_at"]
    return {**row, "updated_at": parse_timestamp(updated_at) if updated_at else None}


def by_partition(stream: Iterable[KafkaRecord], partitions: int) -> dict[int, list[KafkaRecord]]:
    """``stream`` split by :func:`partition_for`, each partition's records in stream order."""
    split: dict[int, list[KafkaRecord]] = defaultdict(list)
    for key, value in stream:
        split[partition_for(key, partitions)].append((key, value))
    return dict(split)


def produce_cdc(
    bootstrap: str,
    topic: str,
    stream: Iterable[KafkaRecord],
    partitions: int = 3,
    create: bool = True,
) -> dict[int, int]:
    """Create ``topic`` with ``partitions`` partitions (unless ``create`` is false: it exists) and
    produce ``stream`` to it.

    Each record goes to :func:`partition_for` its key, in ``stream`` order within a partition (one
    producer per partition, each flushed before the next), so a key's records stay in one
    partition in the order given. Returns how many records each partition got.
    """
    if create:
        create_topic(bootstrap, topic, partitions=partitions)
    return {
        partition: produce(bootstrap, topic, part, partition=partition)
        for partition, part in sorted(by_partition(stream, partitions).items())
    }


def delivered_changes(stream: Iterable[ChangeEvent]) -> int:
    """How many records of ``stream`` are change events (tombstones excluded, duplicates counted)."""
    return sum(1 for event in stream if not event.tombstone)

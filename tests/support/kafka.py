"""Test helpers around the real broker: topics, keyed payloads, produce."""

from __future__ import annotations

import json
from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(timeout=60)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=60)


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]]
) -> int:
    """Produce (key, value) records, wait for every delivery, return how many were sent."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    count = 0
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "some records were not delivered"
    return count


def order_payloads(count: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """``count`` keyed JSON order records with unique ids."""
    return [
        (
            f"customer-{i % 97}".encode(),
            json.dumps({"order_id": i, "amount": round(i * 0.37, 2)}).encode(),
        )
        for i in range(start, start + count)
    ]

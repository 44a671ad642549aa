"""Test helpers around the real broker: topics, keyed payloads, produce."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

#: Largest record the local broker accepts (``message.max.bytes`` in platform/kafka/broker.py).
LARGE_RECORD_BYTES = 8 * 1024 * 1024
#: Topic config for topics that carry records larger than Kafka's ~1 MB default.
LARGE_RECORD_TOPIC_CONFIG = {"max.message.bytes": str(LARGE_RECORD_BYTES)}
#: Producer config for records up to :data:`LARGE_RECORD_BYTES` (librdkafka's default is ~1 MB).
LARGE_RECORD_PRODUCER_CONFIG = {"message.max.bytes": LARGE_RECORD_BYTES}


def create_topic(
    bootstrap: str, topic: str, partitions: int = 3, config: dict[str, str] | None = None
) -> None:
    """Create ``topic``; ``config`` holds topic-level settings such as ``max.message.bytes``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(topic, num_partitions=partitions, config=dict(config or {}))
    for future in admin.create_topics([new_topic]).values():
        future.result(timeout=60)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=60)


def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions the broker's metadata shows for ``topic`` (0 if it does not exist).

    Lists all topics: a metadata request naming a missing topic may auto-create it.
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        return 0
    return len(described.partitions)


def add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 60.0) -> None:
    """Grow ``topic`` to ``total`` partitions and wait until the metadata shows all of them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while partition_count(bootstrap, topic) < total:
        assert time.monotonic() < deadline, f"{topic} did not show {total} partitions"
        time.sleep(0.2)


def wait_topic_deleted(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Block until the broker's metadata no longer lists ``topic`` (deletion is asynchronous)."""
    deadline = time.monotonic() + timeout
    while partition_count(bootstrap, topic):
        assert time.monotonic() < deadline, f"{topic} still exists {timeout:.0f} s after deletion"
        time.sleep(0.2)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark: the offset the next record written there will get."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "conflux-tests-watermarks"})
    try:
        partitions = consumer.list_topics(timeout=30).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    partition: int | None = None,
    config: Mapping[str, str | int] | None = None,
) -> int:
    """Produce (key, value) records, wait for every delivery, return how many were sent.

    ``partition`` sends every record to that partition (default: the key's partition);
    ``config`` adds or overrides producer settings, e.g. :data:`LARGE_RECORD_PRODUCER_CONFIG`.
    """
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", **(config or {})}
    )
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    target = -1 if partition is None else partition  # -1: the partitioner chooses
    count = 0
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=target, on_delivery=delivered)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0, "some records were not delivered"
    assert not failures, f"{len(failures)} records failed: {failures[:3]}"
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

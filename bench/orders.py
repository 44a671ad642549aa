"""Benchmark input: ~500-byte JSON order events, produced fast (throughput) or paced (latency)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import BenchError, say

PRODUCTS = ("espresso", "latte", "flat-white", "cortado", "mocha", "americano", "chai", "matcha")
CHANNELS = ("web", "app", "store")
TARGET_BYTES = 500
FAST_PRODUCER = {
    "linger.ms": 50,
    "batch.num.messages": 100_000,
    "batch.size": 1_000_000,
    "compression.type": "none",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": "all",
}
PACED_PRODUCER = {"linger.ms": 1, "compression.type": "none", "acks": "all"}


def _event(i: int, event_time: str, extra: str, note: str) -> str:
    return (
        f'{{{extra}"order_id":{i},"customer_id":"c{i * 7919 % 5000:05d}",'
        f'"product":"{PRODUCTS[i % 8]}","quantity":{i % 4 + 1},'
        f'"unit_price":{(i * 37 % 2800) / 100 + 2.5:.2f},"currency":"EUR",'
        f'"store_id":"s{i * 31 % 250:04d}","channel":"{CHANNELS[i % 3]}",'
        f'"event_time":"{event_time}","session_id":"{i * 0x9E3779B97F4A7C15 % (1 << 128):032x}",'
        f'"note":"{note}"}}'
    )


def _note() -> str:
    """Padding that brings a typical event to about :data:`TARGET_BYTES` bytes."""
    words = "customer asked for oat milk, extra hot, no sugar; pickup at the side door. "
    base = len(_event(500_000, datetime.now(UTC).isoformat(), "", ""))
    return (words * 10)[: TARGET_BYTES - base]


NOTE = _note()


def order_event(i: int, event_time: str, extra: str = "") -> tuple[bytes, bytes]:
    """(key, value) of order ``i``; ``extra`` is JSON members put first (``"a":1,``)."""
    return f"c{i * 7919 % 5000:05d}".encode(), _event(i, event_time, extra, NOTE).encode()


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(timeout=60)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=60)


def topic_size(bootstrap: str, topic: str, partitions: int = 3) -> int:
    """Records in ``topic``: the sum of its partitions' high watermarks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def _send(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)


@dataclass(frozen=True)
class ProduceStats:
    records: int
    seconds: float
    payload_bytes: int

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def megabytes_per_second(self) -> float:
        return self.payload_bytes / self.seconds / 1e6


def produce_fast(bootstrap: str, topic: str, count: int) -> ProduceStats:
    """Produce ``count`` order events as fast as possible; verify the topic holds them all."""
    producer = Producer({"bootstrap.servers": bootstrap, **FAST_PRODUCER})
    event_time = datetime.now(UTC).isoformat()
    total_bytes = 0
    started = time.monotonic()
    for i in range(count):
        key, value = order_event(i, event_time)
        total_bytes += len(value)
        _send(producer, topic, key, value)
        if i % 10_000 == 0:
            producer.poll(0)
            event_time = datetime.now(UTC).isoformat()
    if producer.flush(300) != 0:
        raise BenchError("some records were not delivered within 300 s")
    stats = ProduceStats(count, time.monotonic() - started, total_bytes)
    _check_size(bootstrap, topic, count)
    return stats


def _check_size(bootstrap: str, topic: str, expected: int) -> None:
    try:
        size = topic_size(bootstrap, topic)
    except KafkaException as exc:
        raise BenchError(f"cannot read the offsets of {topic}: {exc}") from exc
    if size != expected:
        raise BenchError(f"{topic} holds {size} records, expected {expected}")


def timed_event(seq: int, now: float) -> tuple[bytes, bytes]:
    """An order event carrying ``seq`` and its produce time in ms (``produced_ms``)."""
    extra = f'"seq":{seq},"produced_ms":{now * 1000:.3f},'
    return order_event(max(seq, 0), datetime.fromtimestamp(now, UTC).isoformat(), extra)


@dataclass(frozen=True)
class Pace:
    """A steady produce rate: ``warmup`` seconds (not measured), then ``seconds`` measured."""

    rate: float
    seconds: float
    warmup: float = 0.0

    @property
    def warmup_events(self) -> int:
        return int(self.rate * self.warmup)

    @property
    def measured_events(self) -> int:
        return int(self.rate * self.seconds)


def produce_paced(
    bootstrap: str,
    topic: str,
    pace: Pace,
    event: Callable[[int, float], tuple[bytes, bytes]] | None = None,
) -> int:
    """Produce at ``pace.rate`` events/s, each stamped when sent; return the events sent.

    ``event(index, now)`` makes the index-th record (key, value) at send time ``now``; by default
    an order event whose ``seq`` is negative for warm-up events and 0, 1, 2... for measured ones.
    """
    make = event or (lambda index, now: timed_event(index - pace.warmup_events, now))
    producer = Producer({"bootstrap.servers": bootstrap, **PACED_PRODUCER})
    total = pace.warmup_events + pace.measured_events
    started = time.monotonic()
    for index in range(total):
        delay = started + index / pace.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        _send(producer, topic, *make(index, time.time()))
        producer.poll(0)
    if producer.flush(60) != 0:
        raise BenchError("some latency events were not delivered within 60 s")
    behind = time.monotonic() - started - total / pace.rate
    if behind > 1.0:
        say(f"WARNING: the paced producer ended {behind:.1f} s late (machine overloaded?)")
    return total


def produce_one(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **PACED_PRODUCER})
    producer.produce(topic, key=key, value=value)
    if producer.flush(30) != 0:
        raise BenchError("the warm-up record was not delivered")

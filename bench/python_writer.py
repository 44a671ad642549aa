"""Runners (c) and (d) of the bronze benchmarks: one Python process, no JVM.

``--mode deltars`` is what a small team writes instead of Spark: a confluent-kafka consumer that
turns each batch of records into an Arrow table and appends it to Delta with delta-rs (the
``deltalake`` package), one commit per ``--commit-records`` records, each commit carrying the
writer's transaction id (Delta's ``txn`` action, as Conflux's bronze does) so a restart could skip
what it already wrote. ``--mode consume`` is the same loop writing nothing: the ceiling of this
machine for reading the topic from Python.

Until the end (``--until-end``, throughput): read every partition from offset 0 to its high
watermark at start, then exit. Otherwise (latency) run until SIGTERM and commit whatever arrived at
least every ``--max-wait-ms`` (the analogue of a trigger interval).

Prints ``bench.writer.commit {json}`` after each commit and one ``bench.writer {json}`` line at the
end: records, commits (records, end time), and per partition the first and last offset, the count
and the offsets that were not one more than the previous (gaps or repeats).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from types import FrameType
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

APP_ID = "bench-python-writer"
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("ms", tz="UTC")),
    ]
)
CONSUMER = {
    "group.id": "bench-python-writer",
    "enable.auto.commit": False,
    "enable.partition.eof": False,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
}
stopping = False


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("deltars", "consume"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--table", help="the Delta table (deltars)")
    parser.add_argument("--commit-records", type=int, default=250_000)
    parser.add_argument("--until-end", action="store_true", help="stop at the high watermarks")
    parser.add_argument("--max-wait-ms", type=int, default=500, help="without --until-end")
    return parser.parse_args()


class Offsets:
    """Per partition: first, last, count, and offsets that broke the +1 sequence."""

    def __init__(self) -> None:
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.breaks = 0

    def see(self, partition: int, offset: int) -> None:
        previous = self.last.get(partition)
        if previous is None:
            self.first[partition] = offset
            self.count[partition] = 0
        elif offset != previous + 1:
            self.breaks += 1
        self.last[partition] = offset
        self.count[partition] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "partitions": {
                str(p): {"first": self.first[p], "last": self.last[p], "count": self.count[p]}
                for p in sorted(self.first)
            },
            "sequence_breaks": self.breaks,
        }


def to_arrow(messages: list[Message]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array([m.topic() for m in messages], pa.string()),
            pa.array([m.partition() for m in messages], pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([m.timestamp()[1] for m in messages], pa.timestamp("ms", tz="UTC")),
        ],
        schema=SCHEMA,
    )


class DeltaAppender:
    """Appends Arrow tables to one Delta table, each commit with the writer's next txn version."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.version = 0
        self.delta: Any = None

    def append(self, batch: pa.Table) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        self.version += 1
        properties = CommitProperties(app_transactions=[Transaction(APP_ID, self.version)])
        target = self.delta if self.delta is not None else self.table
        write_deltalake(target, batch, mode="append", commit_properties=properties)
        if self.delta is None:
            self.delta = DeltaTable(self.table)


def high_watermarks(consumer: Consumer, topic: str, partitions: int) -> dict[int, int]:
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        for p in range(partitions)
    }


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    global stopping
    stopping = True


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    consumer = Consumer({"bootstrap.servers": args.bootstrap, **CONSUMER})
    ends = high_watermarks(consumer, args.topic, args.partitions) if args.until_end else {}
    consumer.assign(
        [TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)]
    )
    appender = DeltaAppender(args.table) if args.mode == "deltars" else None
    offsets = Offsets()
    commits: list[dict[str, Any]] = []
    pending: list[Message] = []
    total = 0
    last_commit = time.monotonic()
    print("bench.writer started", flush=True)

    def commit() -> None:
        nonlocal pending, last_commit
        if appender is not None:
            appender.append(to_arrow(pending))
        record = {"records": len(pending), "end_epoch": time.time()}
        commits.append(record)
        print("bench.writer.commit " + json.dumps(record), flush=True)
        pending = []
        last_commit = time.monotonic()

    while not stopping:
        if args.until_end and all(offsets.last.get(p, -1) + 1 >= end for p, end in ends.items()):
            break
        for message in consumer.consume(num_messages=10_000, timeout=0.1):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consume failed: {error}")
            offsets.see(int(message.partition() or 0), int(message.offset() or 0))
            pending.append(message)
            total += 1
            if len(pending) >= args.commit_records:
                commit()
        waited = (time.monotonic() - last_commit) * 1000
        if pending and not args.until_end and waited >= args.max_wait_ms:
            commit()
    if pending:
        commit()
    consumer.close()
    print("bench.writer " + json.dumps({"records": total, "commits": commits,
                                        **offsets.summary()}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Demo input: sample order events to the Kafka topic ``orders`` and JSON files to the landing zone.

Usage: ``python platform/demo/produce_sample.py [--events 2000] [--files 3]``. Each call adds new
events (ids continue from a counter kept under the runtime folder), so running the demo twice
ingests only the new ones. A few deliberately bad records show how bronze keeps every byte.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.locations import FlowLocations
from pipelines.settings import Settings, load_settings
from pipelines.spec import load_specs

TOPIC = "orders"
PRODUCTS = ("espresso", "latte", "flat-white", "cortado", "mocha")
#: Records a real topic sees sooner or later; bronze must keep them, silver decides.
BAD_RECORDS = (b"\xff\xfe not utf-8", b'{"order_id": "truncated', b"")


def order(order_id: int, rng: random.Random) -> dict[str, object]:
    return {
        "order_id": order_id,
        "customer_id": f"c{rng.randint(1, 200):04d}",
        "product": rng.choice(PRODUCTS),
        "quantity": rng.randint(1, 4),
        "amount": round(rng.uniform(2.5, 30.0), 2),
        "event_time": datetime.now(UTC).isoformat(),
    }


def next_ids(settings: Settings, count: int) -> range:
    counter = settings.runtime_dir / "demo" / "next_order_id"
    counter.parent.mkdir(parents=True, exist_ok=True)
    start = int(counter.read_text()) if counter.exists() else 1
    counter.write_text(str(start + count))
    return range(start, start + count)


def produce_events(bootstrap: str, ids: range, rng: random.Random) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC not in admin.list_topics(timeout=30).topics:
        for future in admin.create_topics([NewTopic(TOPIC, num_partitions=3)]).values():
            future.result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for order_id in ids:
        event = order(order_id, rng)
        producer.produce(
            TOPIC, key=str(event["customer_id"]).encode(), value=json.dumps(event).encode()
        )
        producer.poll(0)
    for bad in BAD_RECORDS:
        producer.produce(TOPIC, key=None, value=bad)
    if producer.flush(60) != 0:
        raise RuntimeError("some demo events were not delivered")
    return len(ids) + len(BAD_RECORDS)


def write_files(
    landing: Path, ids: range, files: int, rng: random.Random, with_oddities: bool
) -> int:
    """Write JSON-lines files atomically; ``with_oddities`` adds records that break the schema."""
    landing.mkdir(parents=True, exist_ok=True)
    per_file = max(1, len(ids) // files)
    written = 0
    for index in range(files):
        chunk = ids[index * per_file : (index + 1) * per_file]
        lines = [json.dumps(order(i, rng)) for i in chunk]
        if index == 0 and with_oddities:  # an unknown field and a type mismatch: _rescued_data
            lines.append(json.dumps({**order(0, rng), "coupon": "WELCOME10"}))
            lines.append(json.dumps({**order(0, rng), "amount": "n/a"}))
        target = landing / f"orders-{chunk.start}-{index}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(target)  # atomic: the stream never sees half a file
        written += len(lines)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--files", type=int, default=3)
    args = parser.parse_args()
    settings = load_settings()
    rng = random.Random()
    sent = produce_events(
        settings.resolved_bootstrap_servers(), next_ids(settings, args.events), rng
    )
    # The file flow infers its schema from the first files it sees: keep those clean, and send
    # records that break the schema only once the schema is stored.
    spec = next(s for s in load_specs(settings.flows_dir) if s.name == "orders_files")
    schema_stored = FlowLocations.of(spec, settings).schema_file.exists()
    lines = write_files(
        settings.runtime_dir / "landing" / "orders",
        next_ids(settings, args.events),
        args.files,
        rng,
        with_oddities=schema_stored,
    )
    print(
        f"produced {sent} records to Kafka topic '{TOPIC}' and {lines} lines in {args.files} files"
    )
    if not schema_stored:
        print("run the demo again to see records that break the file schema land in _rescued_data")
    return 0


if __name__ == "__main__":
    sys.exit(main())

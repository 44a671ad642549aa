"""At-least-once in, exactly once out: re-sent changes, unsent TOAST values and truncates
(``pipelines/silver/changes.py``), through a real flow on the session's broker and Spark.

The records are shaped as Debezium 3.6's PostgreSQL connector writes them (bare payloads, the
connector's ``schemas.enable=false``), written by the test so that each case lands where it must:
three runs of one flow, one silver batch each. The real connector reading a real PostgreSQL,
killed mid-stream and mid-snapshot, is ``test_debezium_source.py``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.silver.debezium import UNAVAILABLE
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.delta_read import read_rows
from tests.support.kafka import create_topic
from tests.support.runtime import KafkaBroker
from tests.support.tables import silver_path

pytestmark = pytest.mark.timeout(600)

TOPIC = "dbz_changes.public.items"
BIG = "x" * 3000  # a TOASTed value: sent once, then its placeholder


def change(op: str, lsn: int, key: int, after: dict[str, Any] | None = None) -> bytes:
    """A bare Debezium envelope (``after`` completed with the key; a delete's ``before`` is the
    key only, as under REPLICA IDENTITY DEFAULT; a truncate has neither)."""
    source = {"lsn": lsn, "txId": lsn // 10, "ts_ms": 1_764_000_000_000 + lsn, "db": "shop",
              "table": "items", "snapshot": "true" if op == "r" else "false"}  # fmt: skip
    image = None if after is None else {"id": key, **after}
    before = {"id": key, "qty": None, "note": None} if op == "d" else None
    payload = {"before": before, "after": None if op in "dt" else image, "op": op,
               "ts_ms": source["ts_ms"], "source": source}  # fmt: skip
    return json.dumps(payload).encode()


def produce(bootstrap: str, records: list[tuple[int | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(TOPIC, key=None if key is None else json.dumps({"id": key}), value=value)
    assert producer.flush(30) == 0


def run(spec: FlowSpec, settings: Settings, spark: SparkSession) -> None:
    code = run_flows([spec], settings, Reporter(), StopRequest(None), "available_now", spark=spark)
    assert code == EXIT_OK


def rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    return read_rows(silver_path(settings, table))


def test_resent_changes_unsent_values_and_a_truncate(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    create_topic(bootstrap, TOPIC, partitions=1)
    spec = load_spec(
        write_spec(
            tmp_path / "flows",
            {
                "name": "dbz_items",
                "source": {"kind": "kafka", "topics": [TOPIC], "starting_offsets": "earliest"},
                "target": {"table": "bronze_dbz_items"},
                "silver": {
                    "format": "debezium",
                    "schema": "id INT, qty INT, note STRING",
                    "debezium": {"truncate": "apply"},
                    # Judged after the unsent values are carried, and never on a TRUNCATE.
                    "expectations": [
                        {"name": "noted", "expr": "note IS NOT NULL", "action": "drop"},
                        {"name": "counted", "expr": "qty >= 0", "action": "fail"},
                    ],
                    "events": {"table": "dbz_item_events"},
                    "quarantine": {"table": "dbz_items_quarantine"},
                    "current": {"table": "dbz_items", "keys": ["id"]},
                    "history": {"table": "dbz_items_history"},
                },
            },
        )
    )
    settings = replace(spark_settings, kafka_bootstrap_servers=bootstrap)
    # Run 1: a snapshot, then changes; a TOASTed note sent once, then as its placeholder.
    first = [
        (1, change("r", 50, 1, {"qty": 1, "note": "a"})),
        (2, change("r", 50, 2, {"qty": 2, "note": BIG})),
        (1, change("u", 100, 1, {"qty": 10, "note": "a"})),
        (2, change("u", 110, 2, {"qty": 20, "note": UNAVAILABLE})),
        (2, change("u", 110, 2, {"qty": 20, "note": UNAVAILABLE})),  # re-sent in the same batch
        (9, change("u", 120, 9, {"qty": 90, "note": UNAVAILABLE})),  # nothing stored to carry
    ]
    produce(bootstrap, first)
    run(spec, settings, spark)
    # Run 2: the worker restarted: the snapshot again at a new position (one row changed since
    # is read with its new value), the stream re-sent from lsn 100, then new changes.
    second = [
        (1, change("r", 130, 1, {"qty": 10, "note": "a"})),  # the same row read again
        (2, change("r", 130, 2, {"qty": 20, "note": BIG})),  # likewise
        (1, change("u", 100, 1, {"qty": 10, "note": "a"})),  # re-sent
        (2, change("u", 110, 2, {"qty": 20, "note": UNAVAILABLE})),  # re-sent
        (2, change("u", 140, 2, {"qty": 21, "note": UNAVAILABLE})),  # carried from the table
        (3, change("c", 150, 3, {"qty": 3, "note": "c"})),
    ]
    produce(bootstrap, second)
    run(spec, settings, spark)
    events = rows(settings, "dbz_item_events")
    changes = sorted((e["id"], e["_op"], e["_source_lsn"]) for e in events)
    assert changes == [
        (1, "r", 50), (1, "u", 100), (2, "r", 50), (2, "u", 110), (2, "u", 140), (3, "c", 150),
    ]  # fmt: skip
    assert all(e["note"] != UNAVAILABLE for e in events)
    assert {e["_source_lsn"]: e["note"] for e in events if e["id"] == 2} == {
        50: BIG, 110: BIG, 140: BIG,
    }  # fmt: skip
    (quarantined,) = rows(settings, "dbz_items_quarantine")
    assert json.loads(quarantined["raw_value"])["source"]["lsn"] == 120
    assert (
        "no earlier change of the key that Conflux stored carries it" in (quarantined["reasons"][0])
    )
    current = {r["id"]: (r["qty"], r["note"]) for r in rows(settings, "dbz_items")}
    assert current == {1: (10, "a"), 2: (21, BIG), 3: (3, "c")}

    # Run 3: a TRUNCATE, a row inserted after it, and a late change from before it.
    third = [
        (None, change("t", 200, 0)),
        (4, change("c", 210, 4, {"qty": 4, "note": "d"})),
        (3, change("u", 190, 3, {"qty": 33, "note": "late"})),  # older than the truncate
    ]
    produce(bootstrap, third)
    run(spec, settings, spark)
    current = {r["id"]: (r["qty"], r["note"]) for r in rows(settings, "dbz_items")}
    assert current == {4: (4, "d")}
    history = sorted(
        (r["id"], r["qty"], r["_valid_from"], r["_valid_to"], r["_is_current"])
        for r in rows(settings, "dbz_items_history")
    )
    assert history == [
        (1, 1, 50, 100, False), (1, 10, 100, 200, False),
        (2, 2, 50, 110, False), (2, 20, 110, 140, False), (2, 21, 140, 200, False),
        (3, 3, 150, 190, False), (3, 33, 190, 200, False),
        (4, 4, 210, None, True),
    ]  # fmt: skip
    truncates = [e for e in rows(settings, "dbz_item_events") if e["_op"] == "t"]
    assert [(t["id"], t["_source_lsn"]) for t in truncates] == [(None, 200)]

    # Run 4: the worker restarted again and re-sends from before the TRUNCATE: nothing is new.
    produce(bootstrap, [(3, change("c", 150, 3, {"qty": 3, "note": "c"})), *third])
    run(spec, settings, spark)
    assert len(rows(settings, "dbz_item_events")) == len(events) + len(third)
    current = {r["id"]: (r["qty"], r["note"]) for r in rows(settings, "dbz_items")}
    assert current == {4: (4, "d")}

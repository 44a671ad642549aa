"""Data quality in the silver stream (real Kafka, Spark and Delta; delta-rs reads back).

1. :func:`test_bad_input_corpus_through_a_running_continuous_flow`: a corpus of bad records (one
   of each class in :data:`CORPUS`: broken JSON, wrong types, missing keys, out-of-range values, a
   5 MB field, non-UTF-8 bytes, unknown enum values, timestamps far in the future and before 1970,
   missing required fields, a JSON array, deep nesting, duplicated keys), among good records, into
   a flow that runs continuously with row expectations of each action. Every batch's rows add up
   (``rows_in = events + quarantined + ignored``, and the batches together saw every record),
   every quarantined record is there once with the reason of its class, the warned and duplicated
   ones are events, and the stream keeps running: good records sent afterwards land too.
2. :func:`test_a_fail_expectation_stops_the_flow_and_writes_nothing`: a ``fail`` expectation
   stops an ``available_now`` run naming the expectation and showing the failing row; the Delta
   versions of every silver table stay where they were; after the documented way forward (the
   action set to ``drop``) the same batch is replayed and the row lands in the quarantine with the
   expectation's name.
3. :func:`test_an_expectation_that_cannot_judge_rows_alike_is_refused_at_start`: a
   non-deterministic, aggregating, non-boolean or unknown-column expectation stops the start.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.errors import ConfigError
from pipelines.locations import table_paths
from pipelines.runner import EXIT_FAILED, EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_source_faults import RecordingReporter, background_flow
from tests.support.delta_read import read_rows
from tests.support.kafka import (
    LARGE_RECORD_PRODUCER_CONFIG,
    LARGE_RECORD_TOPIC_CONFIG,
    create_topic,
    produce,
)
from tests.support.runtime import KafkaBroker

SCHEMA = "id BIGINT, amount DOUBLE, status STRING, email STRING, note STRING, created_at TIMESTAMP"
EXPECTATIONS = [
    {"name": "amount_in_range", "rule": "between", "args": {"column": "amount", "min": 0, "max": 1e6}, "action": "drop"},
    {"name": "known_status", "rule": "values_in_set", "args": {"column": "status", "values": ["new", "paid", "shipped"]}, "action": "drop"},
    {"name": "created_not_in_future", "rule": "not_in_future", "args": {"column": "created_at", "skew": "1 day"}, "action": "drop"},
    {"name": "created_after_1970", "rule": "not_before", "args": {"column": "created_at"}, "action": "drop"},
    {"name": "email_present", "rule": "not_null", "args": {"column": "email"}, "action": "drop"},
    {"name": "note_size", "rule": "max_length", "args": {"column": "note", "length": 100_000}, "action": "drop"},
    {"name": "example_domain", "expr": "email LIKE '%@example.com'", "action": "warn"},
]  # fmt: skip


def order(id_: Any, **changes: Any) -> dict[str, Any]:
    row = {
        "id": id_,
        "amount": 10.5,
        "status": "new",
        "email": f"c{id_}@example.com",
        "note": "ok",
        "created_at": "2026-01-02T03:04:05Z",
    }
    return {**row, **changes}


def encoded(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def deeply_nested(depth: int) -> bytes:
    return b'{"id": 9014, "amount": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


#: (class, value, where it goes: "quarantine" with a reason substring, or "events").
CORPUS: list[tuple[str, bytes, str, str]] = [
    ("truncated JSON", encoded(order(9001))[:30], "quarantine", "value is not valid JSON"),
    ("not JSON", b"hello, world", "quarantine", "value is not valid JSON"),
    ("wrong type", encoded(order(9003, amount="abc")), "quarantine", "does not match the declared schema: amount (double)"),
    ("null key", encoded(order(None)), "quarantine", "missing key column id"),
    ("missing key", encoded({k: v for k, v in order(0).items() if k != "id"}), "quarantine", "missing key column id"),
    ("out-of-range value", encoded(order(9006, amount=-5)), "quarantine", "expectation amount_in_range failed"),
    ("a 5 MB field", encoded(order(9007, note="x" * 5_000_000)), "quarantine", "expectation note_size failed"),
    ("non-UTF-8 bytes", b'{"id": 9008, "note": "\xff\xfe"}', "quarantine", "value is not valid UTF-8"),
    ("unknown enum value", encoded(order(9009, status="refunded")), "quarantine", "expectation known_status failed"),
    ("timestamp far in the future", encoded(order(9010, created_at="2999-01-01T00:00:00Z")), "quarantine", "expectation created_not_in_future failed"),
    ("timestamp before 1970", encoded(order(9011, created_at="1969-07-20T20:17:40Z")), "quarantine", "expectation created_after_1970 failed"),
    ("missing required field", encoded({k: v for k, v in order(9012).items() if k != "email"}), "quarantine", "expectation email_present failed"),
    ("JSON array", encoded([order(9013)]), "quarantine", "value is JSON but not a JSON object"),
    ("deeply nested JSON", deeply_nested(5000), "quarantine", "value is not valid JSON"),
    ("duplicated key (1 of 2)", encoded(order(9015, status="paid")), "events", ""),
    ("duplicated key (2 of 2)", encoded(order(9015, status="paid")), "events", ""),
    ("warned: another domain", encoded(order(9016, email="c9016@other.org")), "events", ""),
]  # fmt: skip


def good(first: int, count: int) -> list[bytes]:
    return [encoded(order(i)) for i in range(first, first + count)]


def quality_flow(name: str, topic: str, expectations: list[dict[str, Any]], mode: str) -> dict:
    trigger = {"mode": mode, **({"interval": "1 second"} if mode == "continuous" else {})}
    return {
        "name": name,
        "source": {
            "kind": "kafka",
            "topics": [topic],
            "starting_offsets": "earliest",
            "max_offsets_per_trigger": 10,
        },
        "target": {"table": f"bronze_{name}"},
        "trigger": trigger,
        "silver": {
            "format": "json",
            "schema": SCHEMA,
            "current": {"table": f"{name}_current", "keys": ["id"]},
            "expectations": expectations,
        },
    }


def test_bad_input_corpus_through_a_running_continuous_flow(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = "quality_corpus"
    create_topic(
        kafka_broker.bootstrap_servers, topic, partitions=1, config=LARGE_RECORD_TOPIC_CONFIG
    )
    values = [*good(1, 20), *(value for _, value, _, _ in CORPUS), *good(21, 20)]
    offsets = {cls: 20 + i for i, (cls, _, _, _) in enumerate(CORPUS)}
    spec = load_spec(
        write_spec(tmp_path / "flows", quality_flow("quality", topic, EXPECTATIONS, "continuous"))
    )
    paths = table_paths(spec, spark_settings)
    later = good(41, 10)
    total = len(values) + len(later)

    def silver_rows_in() -> int:
        return sum(
            int(b.quality["rows_in"]) for b in flow.reporter.batches if b.quality is not None
        )

    with background_flow(spec, spark_settings, spark, tmp_path) as flow:
        produce(
            kafka_broker.bootstrap_servers,
            topic,
            [(b"k", v) for v in values],
            partition=0,
            config=LARGE_RECORD_PRODUCER_CONFIG,
        )
        flow.wait_until(lambda: silver_rows_in() >= len(values), 300, "silver over the corpus")
        produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in later], partition=0)
        flow.wait_until(lambda: silver_rows_in() >= total, 120, "silver after the corpus")
        assert flow.thread.is_alive(), "the stream stopped on bad input"
        assert flow.finish() == EXIT_OK

    reports = [b.quality for b in flow.reporter.batches if b.quality is not None]
    for report in reports:  # every batch adds up
        assert report["rows_in"] == report["events"] + report["quarantined"] + report["ignored"]
        assert report["events"] == report["passed"] + report["warned"]
    assert silver_rows_in() == total

    quarantined = {
        row["offset"]: row for row in read_rows(paths["quarantine"], ["offset", "reasons"])
    }
    expected_quarantine = {offsets[c]: r for c, _, where, r in CORPUS if where == "quarantine"}
    assert sorted(quarantined) == sorted(expected_quarantine)  # each once, nothing else
    for cls, _, where, reason in CORPUS:
        if where == "quarantine":
            reasons = quarantined[offsets[cls]]["reasons"]
            assert any(reason in r for r in reasons), (cls, reasons)

    events = read_rows(paths["events"], ["id", "_source_offset"])
    assert Counter(e["id"] for e in events)[9015] == 2  # both deliveries are events
    assert len(events) == total - len(expected_quarantine)
    current = read_rows(paths["current"], ["id"])
    assert sorted(r["id"] for r in current) == sorted(
        {*range(1, 51), 9015, 9016}
    )  # the duplicate compacted to one row
    totals = Counter[str]()
    for report in reports:
        for outcome in report["expectations"]:
            totals[outcome["name"]] += outcome["failed"]
    # The other domain, and the row without an email (null fails a condition): that row was
    # dropped by email_present, so only the first is a warned event.
    assert totals["example_domain"] == 2
    assert sum(r["warned"] for r in reports) == 1
    dropped = [c for c, _, _, reason in CORPUS if reason.startswith("expectation")]
    assert sum(r["dropped"] for r in reports) == len(dropped)
    # the wrong type is the one non-additive schema change: it warns the schema_changes check
    assert sum(r["schema_mismatches"] for r in reports) == 1


def test_a_fail_expectation_stops_the_flow_and_writes_nothing(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = "quality_fail"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    expectation = {"name": "positive_amount", "expr": "amount > 0", "action": "fail"}
    flow = quality_flow("quality_fail", topic, [expectation], "available_now")
    spec = load_spec(write_spec(tmp_path / "flows", flow))
    paths = {role: str(p) for role, p in table_paths(spec, spark_settings).items()}

    def run() -> tuple[int, RecordingReporter]:
        reporter = RecordingReporter()
        code = run_flows(
            [spec], spark_settings, reporter, StopRequest(None), "available_now", spark=spark
        )
        return code, reporter

    def versions() -> dict[str, int]:
        return {role: DeltaTable(p).version() for role, p in paths.items()}

    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in good(1, 3)], partition=0)
    code, _ = run()
    assert code == EXIT_OK
    before = versions()

    bad = encoded(order(4, amount=-1.0))
    batch = [*good(5, 2), bad, b"not json"]
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in batch], partition=0)
    code, reporter = run()
    assert code == EXIT_FAILED
    error = " ".join(reporter.errors)
    assert "expectation positive_amount (amount > 0) failed on 1 row(s)" in error, error
    assert '"amount":-1.0' in error and '"id":4' in error, error  # the failing row is shown
    after = versions()
    silver = {role: v for role, v in after.items() if role != "bronze"}
    assert silver == {role: v for role, v in before.items() if role != "bronze"}
    assert after["bronze"] > before["bronze"]  # bronze took the records: they are not lost

    # The documented way forward: the expectation's action set to drop; the batch is replayed.
    dropping = {**expectation, "action": "drop"}
    spec = load_spec(
        write_spec(
            tmp_path / "flows", quality_flow("quality_fail", topic, [dropping], "available_now")
        )
    )
    code, _ = run()
    assert code == EXIT_OK
    quarantine = read_rows(paths["quarantine"], ["offset", "reasons"])
    reasons = {row["offset"]: row["reasons"] for row in quarantine}
    assert any("expectation positive_amount failed" in r for r in reasons[5]), reasons
    assert any("not valid JSON" in r for r in reasons[6]), reasons
    assert sorted(r["id"] for r in read_rows(paths["current"], ["id"])) == [1, 2, 3, 5, 6]


@pytest.mark.parametrize(
    ("case", "expr", "refusal"),
    [
        ("random", "amount > rand()", "is not deterministic"),
        ("aggregate", "count(*) > 0", "no aggregates or window functions"),
        ("number", "amount + 1", "is double, not a condition"),
        ("unknown", "nope > 0", "does not analyse against the parsed row"),
    ],
)
def test_an_expectation_that_cannot_judge_rows_alike_is_refused_at_start(
    spark: SparkSession,
    spark_settings: Settings,
    tmp_path: Path,
    case: str,
    expr: str,
    refusal: str,
) -> None:
    name = f"quality_refused_{case}"
    flow = quality_flow(name, name, [{"name": "odd", "expr": expr}], "available_now")
    spec = load_spec(write_spec(tmp_path / "flows", flow))
    with pytest.raises(ConfigError) as refused:
        run_flows([spec], spark_settings, RecordingReporter(), StopRequest(None), spark=spark)
    message = str(refused.value)
    assert "silver.expectations" in message and refusal in message, message


pytestmark = pytest.mark.timeout(900)

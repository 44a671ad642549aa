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
   stops an ``available_now`` run naming the expectation and showing the failing row (the only
   one counted among good rows of the same batch); every silver table stays at the version that
   created it while bronze keeps the records; after the documented way forward (the action set to
   ``drop``) the same batch is replayed and the row lands in the quarantine with the
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
from pyspark.sql import SparkSession

from pipelines.catalog.tables import declared_paths
from pipelines.errors import ConfigError
from pipelines.messages import BatchQuality, StopReason
from pipelines.runner import EXIT_FAILED, EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from quality.checks import accounting_problems
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_source_faults import RecordingReporter, background_flow
from tests.support.delta_read import delta_table, read_rows
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
            # every step of these tests fits one bronze batch: their batch counts prove nothing
            "max_offsets_per_trigger": 100,
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
    paths = declared_paths(spec, spark_settings)
    later = good(41, 10)
    total = len(values) + len(later)

    def silver_rows_in() -> int:
        return sum(
            b.quality.rows_in for b in flow.reporter.batches if isinstance(b.quality, BatchQuality)
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

    reports = [b.quality for b in flow.reporter.batches if isinstance(b.quality, BatchQuality)]
    for report in reports:  # every batch adds up
        assert report.rows_in == report.events + report.quarantined + report.ignored
        assert report.events == report.passed + report.warned
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
        for outcome in report.expectations:
            totals[outcome.name] += outcome.failed
    # The other domain, and the row without an email (null fails a condition): that row was
    # dropped by email_present, so only the first is a warned event.
    assert totals["example_domain"] == 2
    assert sum(r.warned for r in reports) == 1
    dropped = [c for c, _, _, reason in CORPUS if reason.startswith("expectation")]
    assert sum(r.dropped for r in reports) == len(dropped)
    # the wrong type is the one non-additive schema change: it warns the schema_changes check
    assert sum(r.schema_mismatches for r in reports) == 1


def test_a_fail_expectation_stops_the_flow_and_writes_nothing(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = "quality_fail"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    expectation = {"name": "positive_amount", "expr": "amount > 0", "action": "fail"}
    flow = quality_flow("quality_fail", topic, [expectation], "available_now")
    spec = load_spec(write_spec(tmp_path / "flows", flow))
    paths = declared_paths(spec, spark_settings)

    def run() -> tuple[int, RecordingReporter]:
        reporter = RecordingReporter()
        code = run_flows(
            [spec], spark_settings, reporter, StopRequest(None), "available_now", spark=spark
        )
        return code, reporter

    def versions() -> dict[str, int]:
        return {role: delta_table(p).version() for role, p in paths.items()}

    # One batch: good rows around the failing one (they pass the expectation), then a record that
    # does not parse. The first run fails on it: no earlier run is needed to show nothing is
    # written, since the tables' creation (at the run's start) is the version they must keep.
    bad = encoded(order(4, amount=-1.0))
    batch = [*good(1, 3), *good(5, 2), bad, b"not json"]
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in batch], partition=0)
    code, reporter = run()
    assert code == EXIT_FAILED
    error = " ".join(reporter.errors)
    assert "expectation positive_amount (amount > 0) failed on 1 row(s)" in error, error
    assert '"amount":-1.0' in error and '"id":4' in error, error  # the failing row is shown
    [stopped] = reporter.stops  # why, typed where the stage raised it
    assert stopped.reason is StopReason.EXPECTATION_FAILED, stopped
    assert stopped.expectations == ("positive_amount",) and stopped.message == error
    after = versions()
    silver = {role: v for role, v in after.items() if role != "bronze"}
    assert silver == dict.fromkeys(silver, 0)  # created at start, never written
    assert after["bronze"] > 0  # bronze took the records: they are not lost

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
        ("clock", "current_date() > DATE'2026-01-01'", "is not deterministic"),
        ("batch", "_batch_id >= 0", "names _batch_id"),
        ("aggregate", "count(*) > 0", "no aggregates or window functions"),
        ("number", "amount + 1", "is double, not a condition"),
        # an unknown column is refused when the spec loads (tests/unit/test_spec_references.py)
        ("unknown", "nope(amount) > 0", "does not analyse against the parsed row"),
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


def with_policy(flow: dict[str, Any], **policy: Any) -> dict[str, Any]:
    return {**flow, "silver": {**flow["silver"], "schema_changes": policy}}


def run_once(
    specs: list[FlowSpec], settings: Settings, spark: SparkSession
) -> tuple[int, RecordingReporter]:
    reporter = RecordingReporter()
    code = run_flows(specs, settings, reporter, StopRequest(None), "available_now", spark=spark)
    return code, reporter


def test_schema_changes_mid_stream_evolve_the_tables_and_quarantine_the_rest(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A running continuous flow meets, mid-stream, new fields (evolved into the tables), a type
    change, a dropped and a renamed column (quarantined, named); it keeps running, every batch
    adds up, and the next start parses the evolved columns again."""
    topic = "quality_schema"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    flow = with_policy(
        quality_flow("quality_schema", topic, [], "continuous"), missing_columns="quarantine"
    )
    flow["silver"]["history"] = {"table": "quality_schema_history"}  # tracks every column
    spec = load_spec(write_spec(tmp_path / "flows", flow))
    paths = declared_paths(spec, spark_settings)
    renamed = order(15)
    renamed["mail"] = renamed.pop("email")
    changes = [
        order(11, coupon="SPRING", points=5),  # offset 10: new fields
        order(12, points=7),
        order(13, amount="12.50 EUR"),  # offset 12: type change
        {k: v for k, v in order(14).items() if k != "note"},  # offset 13: dropped column
        renamed,  # offset 14: renamed column
        *(order(i) for i in range(16, 21)),
    ]

    def silver_rows_in() -> int:
        return sum(
            b.quality.rows_in for b in bg.reporter.batches if isinstance(b.quality, BatchQuality)
        )

    with background_flow(spec, spark_settings, spark, tmp_path) as bg:
        send = [(b"k", encoded(v)) for v in (order(i) for i in range(1, 11))]
        produce(kafka_broker.bootstrap_servers, topic, send, partition=0)
        bg.wait_until(lambda: silver_rows_in() >= 10, 180, "silver before the changes")
        send = [(b"k", encoded(v)) for v in changes]
        produce(kafka_broker.bootstrap_servers, topic, send, partition=0)
        bg.wait_until(lambda: silver_rows_in() >= 20, 180, "silver after the changes")
        assert bg.thread.is_alive(), "the stream stopped on a schema change"
        assert bg.finish() == EXIT_OK

    silver_batches = [b for b in bg.reporter.batches if isinstance(b.quality, BatchQuality)]
    for batch in silver_batches:  # against what Spark read and Delta committed, too
        assert accounting_problems(batch.to_json()) == [], batch
    reports = [b.quality for b in silver_batches if isinstance(b.quality, BatchQuality)]
    assert sum(r.schema_mismatches for r in reports) == 3
    assert [c for r in reports for c in r.columns_added] == ["coupon STRING", "points BIGINT"]

    quarantined = {r["offset"]: r["reasons"] for r in read_rows(paths["quarantine"])}
    assert sorted(quarantined) == [12, 13, 14]
    assert any("declared schema: amount (double)" in r for r in quarantined[12])
    assert any("missing from the record" in r and r.endswith(": note") for r in quarantined[13])
    assert any("missing from the record" in r and r.endswith(": email") for r in quarantined[14])
    events = {r["id"]: r for r in read_rows(paths["events"])}
    assert sorted(events) == [*range(1, 13), *range(16, 21)]
    assert (events[11]["coupon"], events[11]["points"]) == ("SPRING", 5)
    assert (events[12]["coupon"], events[12]["points"]) == (None, 7)
    assert events[1]["points"] is None  # rows before the change read null
    current = {r["id"]: r for r in read_rows(paths["current"])}
    assert current[11]["points"] == 5
    assert "mail" not in events[1]  # a renamed column's record was quarantined: nothing evolved
    # history keeps evolved columns untracked: no version of its own; their values are kept
    history = read_rows(paths["history"], ["id", "points", "_is_current"])
    assert len(history) == len(events)  # one version per key (one create each)
    assert {r["id"]: r["points"] for r in history}[11] == 5

    # The next start reads the evolved columns back: no refusal, and they are parsed.
    produce(
        kafka_broker.bootstrap_servers, topic, [(b"k", encoded(order(21, points=9)))], partition=0
    )
    code, _ = run_once([load_spec(Path(spec.spec_file))], spark_settings, spark)
    assert code == EXIT_OK
    assert read_rows(paths["events"], ["points"], "id = 21") == [{"points": 9}]


def test_rescue_quarantine_and_fail_policies(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Two flows on one topic, in one application: one rescues undeclared fields into
    ``_rescued_data`` (values as sent), the other quarantines them; then a type change stops
    the second (``type_changes: fail``) with nothing written, until its policy says quarantine.
    A Debezium flow (in the first application too) quarantines an image whose column was dropped
    upstream and evolves an added one."""
    topic = "quality_policies"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    folder = tmp_path / "flows"
    rescue = load_spec(
        write_spec(
            folder,
            with_policy(
                quality_flow("quality_rescue", topic, [], "available_now"), new_columns="rescue"
            ),
        )
    )
    strict_flow = with_policy(
        quality_flow("quality_strict", topic, [], "available_now"),
        new_columns="quarantine",
        type_changes="fail",
    )
    strict = load_spec(write_spec(folder, strict_flow))
    # Debezium (its own topic and tables, so it shares the first application): images carry
    # every column, so a missing one was dropped upstream.
    cdc_topic = "quality_cdc_schema"
    create_topic(kafka_broker.bootstrap_servers, cdc_topic, partitions=1)
    cdc = load_spec(
        write_spec(
            folder,
            {
                "name": "quality_cdc_schema",
                "source": {"kind": "kafka", "topics": [cdc_topic], "starting_offsets": "earliest"},
                "target": {"table": "bronze_quality_cdc_schema"},
                "trigger": {"mode": "available_now"},
                "silver": {
                    "format": "debezium",
                    "schema": "id BIGINT, name STRING, email STRING",
                    "current": {"table": "quality_cdc_schema_current", "keys": ["id"]},
                },
            },
        )
    )

    def change(lsn: int, after: dict[str, Any]) -> bytes:
        source = {"lsn": lsn, "ts_ms": 1_700_000_000_000 + lsn}
        return encoded({"before": None, "after": after, "op": "c", "source": source})

    records = [
        change(1, {"id": 1, "name": "a", "email": "a@x"}),
        change(2, {"id": 2, "name": "b", "email": "b@x", "phone": "555"}),  # column added
        change(3, {"id": 3, "name": "c"}),  # email dropped upstream
    ]
    values = [*good(1, 2), encoded(order(3, extra=1, nested={"a": [1, "x"]}))]
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in values], partition=0)
    produce(kafka_broker.bootstrap_servers, cdc_topic, [(b"k", v) for v in records], partition=0)
    code, _ = run_once([rescue, strict, cdc], spark_settings, spark)
    assert code == EXIT_OK

    rescue_paths = declared_paths(rescue, spark_settings)
    events = {r["id"]: r["_rescued_data"] for r in read_rows(rescue_paths["events"])}
    assert events[1] is None and events[2] is None
    assert json.loads(events[3]) == {"extra": 1, "nested": {"a": [1, "x"]}}
    current = {r["id"]: r["_rescued_data"] for r in read_rows(rescue_paths["current"])}
    assert json.loads(current[3]) == {"extra": 1, "nested": {"a": [1, "x"]}}
    strict_paths = declared_paths(strict, spark_settings)
    quarantined = {r["offset"]: r["reasons"] for r in read_rows(strict_paths["quarantine"])}
    assert quarantined == {2: ["undeclared columns (schema_changes.new_columns): extra, nested"]}

    def versions() -> dict[str, int]:
        return {role: delta_table(p).version() for role, p in strict_paths.items()}

    before = versions()
    produce(
        kafka_broker.bootstrap_servers,
        topic,
        [(b"k", encoded(order(4))), (b"k", encoded(order(5, amount="abc")))],
        partition=0,
    )
    code, reporter = run_once([strict], spark_settings, spark)
    assert code == EXIT_FAILED
    error = " ".join(reporter.errors)
    assert "SchemaChangeError" in error and "type_changes: fail" in error, error
    assert '"_source_offset":4' in error and "amount (double)" in error, error
    assert [s.reason for s in reporter.stops] == [StopReason.SCHEMA_CHANGE_REFUSED]
    after = versions()
    assert {r: v for r, v in after.items() if r != "bronze"} == {
        r: v for r, v in before.items() if r != "bronze"
    }
    strict = load_spec(
        write_spec(
            folder,
            with_policy(strict_flow, new_columns="quarantine", type_changes="quarantine"),
        )
    )
    code, _ = run_once([strict], spark_settings, spark)
    assert code == EXIT_OK
    quarantined = {r["offset"]: r["reasons"] for r in read_rows(strict_paths["quarantine"])}
    assert any("amount (double)" in r for r in quarantined[4])
    assert sorted(r["id"] for r in read_rows(strict_paths["current"], ["id"])) == [1, 2, 4]

    # Field names that keep changing are data: past max_new_columns the flow stops, unchanged.
    wide = load_spec(
        write_spec(
            folder,
            with_policy(
                quality_flow("quality_wide", topic, [], "available_now"), max_new_columns=1
            ),
        )
    )
    code, reporter = run_once([wide], spark_settings, spark)
    assert code == EXIT_FAILED
    error = " ".join(reporter.errors)
    assert "max_new_columns (1)" in error and "(extra, nested)" in error, error
    wide_events = declared_paths(wide, spark_settings)["events"]
    assert delta_table(wide_events).version() == 0  # created at start, never written

    # The Debezium flow of the first application: the dropped column quarantined, the added one
    # evolved.
    cdc_paths = declared_paths(cdc, spark_settings)
    current = {r["id"]: r for r in read_rows(cdc_paths["current"])}
    assert sorted(current) == [1, 2] and current[2]["phone"] == "555"
    assert current[1]["phone"] is None
    reasons = [r["reasons"] for r in read_rows(cdc_paths["quarantine"])]
    assert reasons == [
        ["declared columns missing from the record (dropped or renamed upstream?): email"]
    ]


pytestmark = pytest.mark.timeout(900)

"""Gold joins: orders joined with the payments of another flow within a time bound, inner and
left outer, late rows of both sides captured and reconciled by a backfill (real Kafka, Spark,
Delta; joined rows read back with delta-rs and compared with a plain-Python join).

Two flows run in one application, run after run (two runs; silver written inside bronze's
batches): ``shop_payments`` (payments from their topic into silver) and ``shop_orders``, whose
two gold tables join its orders (left) with those payments (right, those with ``paid > 0``) on
``order_id`` when ``ts <= paid_at <= ts + 15 minutes`` (left outer) or ``ts - 2 minutes <=
paid_at <= ts + 15 minutes`` (inner). The allowed lateness is 5 minutes, so the join's watermark
is the least over both sides of the newest event time sent in earlier runs minus 5 minutes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from pyspark.sql import SparkSession

from pipelines.gold.backfill import BackfillRefusedError, backfill, unreconciled
from pipelines.location import Location
from pipelines.messages import GoldQuality
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_specs
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_source_faults import RecordingReporter
from tests.support.delta_read import read_rows
from tests.support.gold import JoinedRow, expected_join, in_older_layout, read_join, utc_values
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker
from tests.support.tables import gold_path, silver_path

BASE = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
BOUND, BEFORE = timedelta(minutes=15), timedelta(minutes=2)


def at(minutes: float) -> datetime:
    return BASE + timedelta(minutes=minutes)


def payment_join(prefix: str, after: str, **right: str) -> dict[str, Any]:
    """A join of the orders with the payments of flow ``<prefix>_payments`` on ``order_id``,
    a payment up to ``after`` after its order."""
    return {
        "keys": ["order_id"],
        "left": {"event_time": "ts", "columns": ["amount"]},
        "right": {
            "flow": f"{prefix}_payments",
            "event_time": "paid_at",
            "columns": ["payment_id", "paid"],
            **right,
        },
        "within": {"after": after},
    }


def join_flows(
    folder: Path,
    prefix: str,
    topics: dict[str, str],
    golds: list[dict[str, Any]],
    trigger: dict[str, str] | None = None,
    chaining: Literal["stream", "bronze_batch"] | None = None,
) -> dict[str, FlowSpec]:
    """Flows ``<prefix>_payments`` and ``<prefix>_orders`` (with the gold tables ``golds``) from
    the topics ``topics["payments"]`` and ``topics["orders"]``, written to ``folder``.

    ``chaining``: both flows' ``silver.chaining`` (the spec's default when None)."""
    timing = {"trigger": trigger} if trigger else {}
    chained = {"chaining": chaining} if chaining else {}
    write_spec(
        folder,
        {
            "name": f"{prefix}_payments",
            "source": {"kind": "kafka", "topics": [topics["payments"]]},
            "target": {"table": f"bronze_{prefix}_payments"},
            **timing,
            "silver": {
                "format": "json",
                "schema": "payment_id BIGINT, order_id BIGINT, paid DOUBLE, paid_at TIMESTAMP",
                **chained,
            },
        },
    )
    write_spec(
        folder,
        {
            "name": f"{prefix}_orders",
            "source": {"kind": "kafka", "topics": [topics["orders"]]},
            "target": {"table": f"bronze_{prefix}_orders"},
            **timing,
            "silver": {
                "format": "json",
                "schema": "order_id BIGINT, amount DOUBLE, ts TIMESTAMP",
                **chained,
            },
            "gold": golds,
        },
    )
    return {spec.name: spec for spec in load_specs(folder)}


def specs(tmp_path: Path, orders_topic: str, payments_topic: str) -> dict[str, FlowSpec]:
    # a zero payment is a card check, not a payment
    join = payment_join("shop", "15 minutes", where="paid > 0")
    golds = [
        {
            "table": "order_payments",
            "allowed_lateness": "5 minutes",
            "join": {**join, "how": "left_outer"},
        },
        {
            "table": "paid_orders",
            "allowed_lateness": "5 minutes",
            "join": {**join, "within": {"after": "15 minutes", "before": "2 minutes"}},
        },
    ]
    topics = {"orders": orders_topic, "payments": payments_topic}
    # silver inside bronze's batches: one query fewer per flow and run; the splits and the joins,
    # what is tested, are unchanged
    return join_flows(tmp_path / "flows", "shop", topics, golds, chaining="bronze_batch")


def send(broker: KafkaBroker, topic: str, rows: list[dict[str, Any]]) -> None:
    def text(value: Any) -> Any:
        return value.isoformat() if isinstance(value, datetime) else value

    records = [(None, json.dumps({k: text(v) for k, v in r.items()}).encode()) for r in rows]
    produce(broker.bootstrap_servers, topic, records)


def order(order_id: int, minutes: float, amount: float) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "ts": at(minutes)}


def payment(payment_id: int, order_id: int, minutes: float, paid: float) -> dict[str, Any]:
    return {"payment_id": payment_id, "order_id": order_id, "paid": paid, "paid_at": at(minutes)}


def split_rows(reporter: RecordingReporter, stage: str) -> int:
    """The rows the split query ``stage`` has read in the batches it committed."""
    return sum(b.input_rows for b in list(reporter.batches) if b.stage == stage)


def late_rows(settings: Settings, table: str) -> list[tuple[str, int]]:
    rows = read_rows(gold_path(settings, table), ["_side", "_source_offset"])
    return sorted((r["_side"], r["_source_offset"]) for r in rows)


def test_joins_capture_late_rows_of_both_sides_and_backfills_reconcile_them(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    create_topic(kafka_broker.bootstrap_servers, "join_orders", partitions=1)
    create_topic(kafka_broker.bootstrap_servers, "join_payments", partitions=1)
    flows = specs(tmp_path, "join_orders", "join_payments")
    orders: list[dict[str, Any]] = []
    payments: list[dict[str, Any]] = []

    def run(new_orders: list[dict[str, Any]], new_payments: list[dict[str, Any]]) -> Any:
        send(kafka_broker, "join_orders", new_orders)
        send(kafka_broker, "join_payments", new_payments)
        orders.extend(new_orders)
        payments.extend(new_payments)
        reporter = RecordingReporter()
        code = run_flows(
            list(flows.values()), spark_settings, reporter, StopRequest(None), spark=spark
        )
        assert code == EXIT_OK, reporter.errors
        return reporter

    outer_path = gold_path(spark_settings, "order_payments")
    inner_path = gold_path(spark_settings, "paid_orders")
    future = datetime.now(UTC) + timedelta(hours=3)
    first = run(
        [order(1, 0, 10.0), order(2, 5, 20.0), order(3, 10, 30.0), order(4, 20, 40.0)],
        [
            payment(101, 1, 3, 10.0),
            payment(102, 2, 30, 20.0),  # 25 minutes after order 2: outside the bound
            payment(104, 4, 22, 40.0),
            {"payment_id": 105, "order_id": 4, "paid": 1.0, "paid_at": None},  # null time
            {"payment_id": 106, "order_id": 4, "paid": 1.0, "paid_at": future},  # wrong clock
            payment(110, 3, 9, 30.0),  # a minute before order 3: within the inner join's bound
            payment(111, 1, 4, 0.0),  # left out by the right side's where
        ],
    )  # newest: orders 10:20, payments 10:30 -> watermark min(10:15, 10:25) = 10:15
    # order_payments_late as written before late rows kept their silver row (its `_left` and
    # `_right` held the join's columns only): the next run grows them
    in_older_layout(
        spark,
        gold_path(spark_settings, "order_payments_late"),
        keep={"_left": ["order_id", "amount"], "_right": ["order_id", "payment_id", "paid"]},
    )
    # pairs at once; no unmatched order yet: 10:05 + 15 minutes is not below the watermark
    assert read_join(inner_path) == [
        (1, 10.0, 101, 10.0),
        (3, 30.0, 110, 30.0),
        (4, 40.0, 104, 40.0),
    ]
    assert read_join(outer_path) == [(1, 10.0, 101, 10.0), (4, 40.0, 104, 40.0)]
    # the 20th is open under 10:15: a backfill is refused
    with pytest.raises(BackfillRefusedError, match="2026-11-20 is still open"):
        backfill(
            spark, flows["shop_orders"], spark_settings, "order_payments", BASE.date(), BASE.date()
        )

    # the stragglers are judged by 10:15 (earlier runs only), though the run also brings the
    # 21st's order 9 and payment 109 (offsets 6 and 10), which close the 20th
    second = run(
        [
            order(5, 40, 50.0),
            order(6, 8, 60.0),  # order 6 at 10:08 <= 10:15: late
            order(9, 15 * 60, 90.0),  # 2026-11-21 01:00
        ],
        [
            payment(103, 2, 12, 20.0),  # order 2's payment at 10:12: late
            payment(107, 5, 45, 50.0),
            payment(108, 6, 9, 60.0),  # late
            payment(109, 9, 15 * 60 + 1, 90.0),
        ],
    )  # watermark min(21st 01:00, 01:01) - 5 minutes = 00:55: orders 2 (10:05) and 3 (10:10)
    # pass their bound
    assert late_rows(spark_settings, "order_payments_late") == [
        ("left", 5),
        ("right", 7),
        ("right", 9),
    ]
    assert late_rows(spark_settings, "paid_orders_late") == late_rows(
        spark_settings, "order_payments_late"
    )
    # a late row holds its side's silver events row whole (`_left` or `_right`, the other null):
    # the order or payment as sent, key and payload
    sent = {"left": orders, "right": payments}
    events = {
        side: {r["_source_offset"]: r for r in read_rows(silver_path(spark_settings, table))}
        for side, table in (("left", "silver_shop_orders_events"), ("right", "silver_shop_payments_events"))
    }  # fmt: skip
    for table in ("order_payments_late", "paid_orders_late"):
        for row in read_rows(gold_path(spark_settings, table)):
            side, offset = row["_side"], row["_source_offset"]
            other = "right" if side == "left" else "left"
            assert row[f"_{other}"] is None, (table, side)
            assert row[f"_{side}"] == events[side][offset], table  # every column of its row
            event = sent[side][offset]
            assert utc_values(row[f"_{side}"], list(event)) == event, (table, side)
    assert (2, 20.0, None, None) in read_join(outer_path)
    assert (3, 30.0, None, None) in read_join(outer_path)

    quarantine = read_rows(silver_path(spark_settings, "silver_shop_orders_quarantine"))
    reasons = sorted(r["reasons"][0] for r in quarantine)
    assert reasons == sorted(
        [
            f"gold {table}: event time paid_at (right side, flow shop_payments) is {what}"
            for table in ("order_payments", "paid_orders")
            for what in (
                "null",
                "later than its ingestion time + max_future_skew (1 hour)",
            )
        ]
    )
    for reporter in (first, second):
        splits = [b for b in reporter.batches if b.stage.endswith(".split")]
        assert splits
        for batch in splits:
            quality = batch.quality
            assert isinstance(quality, GoldQuality)
            assert batch.input_rows == quality.rows_in
            assert quality.rows_in == (
                quality.on_time + quality.late + quality.quarantined + quality.filtered
            )
        joins = [
            b for b in reporter.batches if b.stage in ("gold.order_payments", "gold.paid_orders")
        ]
        assert joins and all(b.state is not None for b in joins)
        assert sum(b.state["rows_dropped_by_watermark"] for b in joins if b.state) == 0

    # the stream's rows: the plain-Python join of the rows that were on time
    splits = [b.quality for b in first.batches if isinstance(b.quality, GoldQuality)]
    assert sum(q.filtered for q in splits) == 2  # both splits
    late_offsets = {("left", 5), ("right", 7), ("right", 9)}
    on_time_orders = [o for i, o in enumerate(orders) if ("left", i) not in late_offsets]
    valid = [p for p in payments if p["paid_at"] not in (None, future) and p["paid"] > 0]
    on_time_payments = [p for p in valid if ("right", payments.index(p)) not in late_offsets]
    assert read_join(inner_path) == expected_join(on_time_orders, on_time_payments, BOUND, BEFORE)
    assert read_join(outer_path) == expected_join(
        on_time_orders, on_time_payments, BOUND, outer=True
    )

    # the 20th closed under 2026-11-21 00:55: the backfill puts the late rows in
    for table, outer, before in (
        ("order_payments", True, timedelta(0)),
        ("paid_orders", False, BEFORE),
    ):
        result = backfill(
            spark, flows["shop_orders"], spark_settings, table, BASE.date(), BASE.date()
        )
        assert result.late_rows_covered == 3
        if outer:  # run again, it changes nothing (once per module; each join equals the model)
            again = backfill(
                spark, flows["shop_orders"], spark_settings, table, BASE.date(), BASE.date()
            )
            assert again.gold_rows == result.gold_rows
        assert unreconciled(spark, flows["shop_orders"], spark_settings, table).count() == 0
        path = gold_path(spark_settings, table)
        day = [o for o in orders if o["ts"].date() == BASE.date()]
        assert read_join(path, "_event_date = '2026-11-20'") == expected_join(
            day, valid, BOUND, before, outer=outer
        )


def test_a_continuous_join_beside_its_split_drops_nothing_the_split_let_through(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Both queries run at once (the case where the join's two sources of the input table can
    be a split commit apart): the split judges with its margin, the join drops nothing, and the
    joined table is the plain-Python join of every row not in the late table.

    Silver is written inside bronze's batches (``chaining: bronze_batch``): four queries instead
    of six on the test machine's cores; the split and the join, what is tested, are unchanged.
    The run is stopped once the split has read every row and the join has joined every on-time
    one, so every batch of both ran beside the other (no catch-up run after the stop)."""
    topics = {"orders": "join_live_orders", "payments": "join_live_payments"}
    for topic in topics.values():
        create_topic(kafka_broker.bootstrap_servers, topic, partitions=1)
    gold = {
        "table": "live_paid_orders",
        "allowed_lateness": "1 minute",
        "join": payment_join("live", "2 minutes"),
    }
    continuous = {"mode": "continuous", "interval": "1 second"}
    flows = join_flows(tmp_path / "live", "live", topics, [gold], continuous, "bronze_batch")
    specs = list(flows.values())
    orders: list[dict[str, Any]] = []
    payments: list[dict[str, Any]] = []
    reporter = RecordingReporter()
    stop_file = Location.local(tmp_path / "live.stop")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["code"] = run_flows(
                specs, spark_settings, reporter, StopRequest(stop_file), spark=spark
            )
        except BaseException as exc:  # surfaced below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="live-join", daemon=True)
    split = f"gold.{gold['table']}.split"

    def wait_until(condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert thread.is_alive(), (f"the run ended before {what}", outcome, reporter.errors)
            assert time.monotonic() < deadline, (f"no {what} in {timeout:.0f} s", reporter.errors)
            time.sleep(0.2)

    def split_has_read(rows: int) -> Callable[[], bool]:
        return lambda: split_rows(reporter, split) >= rows

    joined_path = gold_path(spark_settings, "live_paid_orders")

    def joined_on_time(
        orders: list[dict[str, Any]], payments: list[dict[str, Any]]
    ) -> list[JoinedRow]:
        """The plain-Python join of the rows not in the late table."""
        late = set(late_rows(spark_settings, "live_paid_orders_late"))
        on_time_orders = [o for i, o in enumerate(orders) if ("left", i) not in late]
        on_time_payments = [p for i, p in enumerate(payments) if ("right", i) not in late]
        return expected_join(on_time_orders, on_time_payments, timedelta(minutes=2))

    sent_before: list[int] = []  # per wave, the rows (orders and payments) sent before it
    thread.start()
    try:
        # event time moves a minute a wave; from the third, stragglers. Six waves: the split
        # reads them in three or more batches beside the join, each further wave a repeat
        for wave in range(6):
            sent_before.append(len(orders) + len(payments))
            if wave >= 2:
                # The split has read and committed every row of the waves before the previous
                # one (each is an event, read once by the split): this wave's rows reach later
                # split batches, whose watermark is at least the newest time of wave - 2 on
                # both sides (wave - 1.05 minutes) minus the minute of lateness. So each of its
                # stragglers, at wave - 3 minutes, is late whatever the machine's pace; the
                # previous wave may still be on its way (the waves overlap, as they would live).
                rows = sent_before[wave - 1]
                wait_until(split_has_read(rows), f"split of {rows} rows")
            first = wave * 20
            new_orders = [order(first + i, wave + i / 20, float(i + 1)) for i in range(20)]
            new_payments = [
                payment(first + i, first + i, wave + i / 20 + 0.5, float(i + 1)) for i in range(20)
            ]
            if wave >= 2:
                new_orders.append(order(1000 + wave, wave - 3, 9.0))  # 3 minutes behind
                new_payments.append(payment(2000 + wave, first, wave - 3, 9.0))
            send(kafka_broker, topics["orders"], new_orders)
            send(kafka_broker, topics["payments"], new_payments)
            orders.extend(new_orders)
            payments.extend(new_payments)
        wait_until(  # the margin path ran at least once
            lambda: any(
                isinstance(b.quality, GoldQuality) and b.quality.watermarks.get("join_running")
                for b in list(reporter.batches)
            ),
            "split batch beside the join",
        )
        # every row reached the split (the late table is final), then the join catches up: wait
        # for the joined table to hold the plain-Python join (only a wait: it is checked below,
        # after the stop, and a join that never gets there fails there once this gives up)
        total = len(orders) + len(payments)
        wait_until(split_has_read(total), f"split of all {total} rows")
        expected = joined_on_time(orders, payments)
        deadline = time.monotonic() + 300
        while read_join(joined_path) != expected and time.monotonic() < deadline:
            assert thread.is_alive(), ("the run ended before the join caught up", outcome)
            time.sleep(0.5)
    finally:
        stop_file.touch()
        thread.join(180)
    assert "error" not in outcome and outcome.get("code") == EXIT_OK, (outcome, reporter.errors)

    joins = [b for b in reporter.batches if b.stage == "gold.live_paid_orders"]
    assert joins and sum(b.state["rows_dropped_by_watermark"] for b in joins if b.state) == 0
    late = set(late_rows(spark_settings, "live_paid_orders_late"))
    stragglers = {("left", i) for i, o in enumerate(orders) if o["order_id"] >= 1000} | {
        ("right", i) for i, p in enumerate(payments) if p["payment_id"] >= 2000
    }
    assert late == stragglers  # each reached a split batch after newer rows of both sides
    assert read_join(joined_path) == joined_on_time(orders, payments)

"""Gold: windowed aggregates by event time with late data captured, deduplication, bad event
times, a clock-skewed partition, and backfills that reconcile the late rows (real Kafka, Spark,
Delta; gold read back with delta-rs and compared with plain Python).

One flow with two gold tables runs in one application, run after run, each run one micro-batch
per query, so the watermark of every batch is known from the events sent before it (two runs:
the second is judged by the first's watermark and brings the event that closes the day; silver is
written inside bronze's batches, ``chaining: bronze_batch``, one query fewer per run: the splits
and the stateful queries, what is tested, are unchanged):

* ``revenue``: tumbling 10-minute windows per product, no deduplication: a row is late when its
  window has closed (window end <= watermark);
* ``orders_5m``: 10-minute windows sliding every 5 minutes, deduplicated by ``order_id`` within
  the watermark: a row is late when its event time is not above the watermark.

The allowed lateness is 5 minutes, so the watermark is the newest event time sent in earlier runs
minus 5 minutes. That test keeps its tables and checkpoints on the module's S3 store; the kill test
below, on the local disk.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipelines.catalog.state import FlowState
from pipelines.gold.backfill import BackfillRefusedError, backfill, unreconciled
from pipelines.messages import GoldQuality
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import Launches, write_spec
from tests.integration.test_source_faults import RecordingReporter
from tests.support.chaos import (
    AFTER_DELTA_COMMIT,
    FULL_SCHEDULE,
    MID_BATCH,
    Aim,
    FlowFiles,
    Landing,
    ProcessGroup,
    RunOutput,
    kill_after_delta_commit,
    kill_mid_batch,
    kill_now,
    seed_from_env,
)
from tests.support.delta_read import read_rows
from tests.support.gold import expected_gold, in_older_layout, project, read_gold, utc_values
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker
from tests.support.tables import gold_path, silver_path

BASE = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
TEN, FIVE = timedelta(minutes=10), timedelta(minutes=5)


def order(order_id: int, minutes: float, product: str, amount: float) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "product": product,
        "amount": amount,
        "ts": BASE + timedelta(minutes=minutes),
    }


def send(broker: KafkaBroker, topic: str, partition: int, orders: list[dict[str, Any]]) -> None:
    records = [
        (
            str(o["order_id"]).encode(),
            json.dumps({**o, "ts": o["ts"].isoformat() if o["ts"] else None}).encode(),
        )
        for o in orders
    ]
    produce(broker.bootstrap_servers, topic, records, partition=partition)


#: The aggregates tests.support.gold.expected_gold computes: sum, count and max of ``amount``.
AGGREGATES = [
    {"name": "revenue", "function": "sum", "column": "amount"},
    {"name": "orders", "function": "count"},
    {"name": "biggest", "function": "max", "column": "amount"},
]
#: The shape of the orders :func:`order` makes, as a silver JSON schema.
ORDER_SCHEMA = "order_id BIGINT, product STRING, amount DOUBLE, ts TIMESTAMP"


def gold_spec(tmp_path: Path, topic: str) -> FlowSpec:
    return load_spec(
        write_spec(
            tmp_path / "flows",
            {
                "name": "shop",
                "source": {"kind": "kafka", "topics": [topic], "starting_offsets": "earliest"},
                "target": {"table": "bronze_shop"},
                "silver": {
                    "format": "json",
                    "schema": ORDER_SCHEMA,
                    "chaining": "bronze_batch",
                },
                "gold": [
                    {
                        "table": "revenue",
                        "event_time": "ts",
                        "allowed_lateness": "5 minutes",
                        "window": {"duration": "10 minutes"},
                        "group_by": ["product"],
                        "aggregates": AGGREGATES,
                    },
                    {
                        "table": "orders_5m",
                        "event_time": "ts",
                        "allowed_lateness": "5 minutes",
                        "window": {"duration": "10 minutes", "slide": "5 minutes"},
                        "deduplicate": ["order_id"],
                        "aggregates": AGGREGATES,
                    },
                ],
            },
        )
    )


def late_keys(settings: Settings, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of the late table's rows, sorted."""
    rows = read_rows(gold_path(settings, table), ["_source_partition", "_source_offset"])
    return sorted((r["_source_partition"], r["_source_offset"]) for r in rows)


def test_late_rows_are_captured_and_backfills_reconcile_them(
    spark: SparkSession, store_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """On the module's S3 store (tables and checkpoints): the local disk runs the same code in the
    other gold tests; here the conditional-write classes carry every commit too."""
    topic = "gold_shop"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
    spec = gold_spec(tmp_path, topic)
    sent: dict[int, list[tuple[int, dict[str, Any]]]] = {0: [], 1: []}  # partition -> (offset, o)

    def run(partition_orders: dict[int, list[dict[str, Any]]]) -> RecordingReporter:
        for partition, orders in partition_orders.items():
            send(kafka_broker, topic, partition, orders)
            sent[partition] += [(len(sent[partition]) + i, o) for i, o in enumerate(orders)]
        reporter = RecordingReporter()
        assert (
            run_flows([spec], store_settings, reporter, StopRequest(None), spark=spark) == EXIT_OK
        )
        return reporter

    future = datetime.now(UTC) + timedelta(hours=3)
    first = run(
        {
            0: [
                order(1, 1, "a", 10.0),
                order(2, 3, "b", 20.0),
                order(3, 12, "a", 5.5),
                order(4, 25, "b", 7.0),
                {"order_id": 5, "product": "a", "amount": 1.0, "ts": None},  # null event time
                {"order_id": 6, "product": "a", "amount": 1.0, "ts": future},  # a wrong clock
            ],
            1: [order(7, 14, "a", 3.0), order(8, 31, "a", 4.0)],
        }
    )  # newest 10:31 -> watermark 10:26
    # revenue_late as written before late rows kept their silver row: the next run grows it
    in_older_layout(spark, gold_path(store_settings, "revenue_late"), drop=["_event"])
    # the day is still open (watermark 10:26 on 2026-11-20): refused, nothing changes
    with pytest.raises(BackfillRefusedError, match="2026-11-20 is still open"):
        backfill(spark, spec, store_settings, "revenue", date(2026, 11, 20), date(2026, 11, 20))
    second = run(  # judged by 10:26 though orders 12 (11:30) and 16 (2026-11-21 01:00) came too
        {
            0: [
                order(9, 2, "a", 100.0),  # late for both: window [10:00, 10:10) closed
                order(10, 24, "b", 8.0),  # [10:20, 10:30) open: on time; deduplicated: late
                order(4, 25, "b", 7.0),  # a resend: counted again in revenue; late in orders_5m
                order(11, 28, "a", 2.0),
            ],
            1: [
                order(8, 31, "a", 4.0),  # a duplicate
                order(12, 90, "a", 6.0),  # a clock ahead
                order(13, 5, "b", 9.0),  # late for both, on the partition ahead
                order(16, 15 * 60, "b", 1.0),  # closes the 20th: newest 01:00 -> watermark 00:55
            ],
        }
    )

    # partition 0: offsets 0..5 (run 1), 6..9 (run 2); partition 1: 0..1 (run 1), 2..5 (run 2)
    assert late_keys(store_settings, "revenue_late") == [(0, 6), (1, 4)]
    assert late_keys(store_settings, "orders_5m_late") == [(0, 6), (0, 7), (0, 8), (1, 4)]
    # a late row holds its silver events row whole (`_event`): the order as sent, key and
    # payload, beside what gold judged (revenue_late too, grown from the older layout)
    events = {
        (r["_source_partition"], r["_source_offset"]): r
        for r in read_rows(silver_path(store_settings, "silver_shop_events"))
    }
    orders = {(p, off): o for p, rows in sent.items() for off, o in rows}
    for table in ("revenue_late", "orders_5m_late"):
        for row in read_rows(gold_path(store_settings, table)):
            key = (row["_source_partition"], row["_source_offset"])
            assert row["_event"] == events[key], table  # every column of the silver row
            assert utc_values(row["_event"], list(orders[key])) == orders[key], table
            assert utc_values(row, ["_event_time", "_watermark"]) == {
                "_event_time": orders[key]["ts"],  # the time gold judged it by
                "_watermark": BASE + timedelta(minutes=26),  # the first run's
            }
    quarantine = read_rows(silver_path(store_settings, "silver_shop_quarantine"))
    reasons = sorted((r["offset"], r["reasons"][0]) for r in quarantine)
    assert reasons == [
        (4, "gold orders_5m: event time ts is null"),
        (4, "gold revenue: event time ts is null"),
        (
            5,
            "gold orders_5m: event time ts is later than its ingestion time + max_future_skew (1 hour)",
        ),
        (
            5,
            "gold revenue: event time ts is later than its ingestion time + max_future_skew (1 hour)",
        ),
    ]

    # every split batch accounts for its rows; Spark's watermark dropped nothing Conflux let by
    for reporter in (first, second):
        splits = [b for b in reporter.batches if b.stage.endswith(".split")]
        assert len(splits) == 2, [b.stage for b in reporter.batches]
        for batch in splits:
            quality = batch.quality
            assert isinstance(quality, GoldQuality)
            assert batch.input_rows == quality.rows_in > 0
            assert quality.rows_in == quality.on_time + quality.late + quality.quarantined
        stateful = [b for b in reporter.batches if b.stage in ("gold.revenue", "gold.orders_5m")]
        assert stateful and all(b.state is not None for b in stateful)
        assert sum(b.state["rows_dropped_by_watermark"] for b in stateful if b.state) == 0

    valid = [
        (p, off, o) for p, rows in sent.items() for off, o in rows if o["ts"] not in (None, future)
    ]
    late_revenue = set(late_keys(store_settings, "revenue_late"))
    late_dedup = set(late_keys(store_settings, "orders_5m_late"))
    revenue_path = gold_path(store_settings, "revenue")
    dedup_path = gold_path(store_settings, "orders_5m")
    on_time = [o for p, off, o in valid if (p, off) not in late_revenue]
    assert read_gold(revenue_path, ["product"]) == expected_gold(on_time, TEN, None, ["product"])
    first_of_each: dict[int, dict[str, Any]] = {}
    for p, off, o in valid:
        if (p, off) not in late_dedup:
            first_of_each.setdefault(o["order_id"], o)
    assert read_gold(dedup_path) == expected_gold(first_of_each.values(), TEN, FIVE)

    # the 20th closed under 2026-11-21 00:55: the backfill puts the late rows in
    for table in ("revenue", "orders_5m"):
        result = backfill(
            spark, spec, store_settings, table, date(2026, 11, 20), date(2026, 11, 20)
        )
        assert result.late_rows_covered == (2 if table == "revenue" else 4)
        if table == "orders_5m":  # run again: nothing changes (revenue's recompute, deduplicated)
            again = backfill(
                spark, spec, store_settings, table, date(2026, 11, 20), date(2026, 11, 20)
            )
            assert (again.gold_rows, again.rows_reflected) == (
                result.gold_rows,
                result.rows_reflected,
            )
        left = unreconciled(spark, spec, store_settings, table)
        assert left.count() == 0

    day = [o for _p, _off, o in valid if o["ts"].date() == date(2026, 11, 20)]
    where = "_event_date = '2026-11-20'"
    assert read_gold(revenue_path, ["product"], where) == expected_gold(day, TEN, None, ["product"])
    unique = {o["order_id"]: o for o in day}
    gold_day = read_gold(dedup_path, where=where)
    assert gold_day == {
        k: v
        for k, v in expected_gold(unique.values(), TEN, FIVE).items()
        if k[0].date() == date(2026, 11, 20)
    }
    reflected = project(read_gold(revenue_path, ["product"], where), ["_rows"])
    assert sum(v["_rows"] for v in reflected.values()) == len(day)


# --- kill -9 during stateful batches ---------------------------------------------------------

CHAOS_RECORDS = int(os.environ.get("GOLD_CHAOS_RECORDS", "20000"))
CHAOS_CHUNKS = 4
PRODUCTS = ("espresso", "latte", "mocha", "cortado", "flat-white")


def chaos_orders(chunk: int, per_chunk: int, rng: random.Random) -> list[dict[str, Any]]:
    """One chunk of orders, event time rising 0.1 s per order; every 50th order is 30 minutes
    behind (late once the watermark has passed its window)."""
    orders = []
    for i in range(chunk * per_chunk, (chunk + 1) * per_chunk):
        minutes = i * 0.1 / 60 - (30 if i % 50 == 0 else 0)
        orders.append(order(i, minutes, rng.choice(PRODUCTS), round(rng.uniform(1, 30), 2)))
    return orders


def test_gold_is_exact_after_kills_during_stateful_batches(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    seed = seed_from_env()
    print(f"\nkill schedule seed: KILL_SEED={seed}")
    rng = random.Random(seed)
    topic = "gold_chaos"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)

    def chaos_spec(max_offsets_per_trigger: int) -> FlowSpec:
        source = {
            "kind": "kafka",
            "topics": [topic],
            "max_offsets_per_trigger": max_offsets_per_trigger,
        }
        return load_spec(
            write_spec(
                tmp_path / "flows",
                {
                    "name": "gold_chaos",
                    "source": source,
                    "target": {"table": "bronze_gold_chaos"},
                    "trigger": {"mode": "continuous", "interval": "1 second"},
                    # silver inside bronze's batches: three queries beside the kills instead of four
                    # on the test machine's cores; the split and the stateful query are unchanged
                    "silver": {
                        "format": "json",
                        "schema": ORDER_SCHEMA,
                        "chaining": "bronze_batch",
                    },
                    "gold": [
                        {
                            "table": "chaos_revenue",
                            "event_time": "ts",
                            "allowed_lateness": "5 minutes",
                            "window": {"duration": "10 minutes"},
                            "group_by": ["product"],
                            "aggregates": [
                                {"name": "revenue", "function": "sum", "column": "amount"},
                                {"name": "orders", "function": "count"},
                                {"name": "biggest", "function": "max", "column": "amount"},
                            ],
                        }
                    ],
                },
            )
        )

    spec = chaos_spec(2000)
    settings = replace(
        spark_settings, spark_conf={"spark.ui.enabled": "false", **spark_settings.spark_conf}
    )
    chaos_path = gold_path(settings, "chaos_revenue")
    state = FlowFiles(
        chaos_path, FlowState.of(spec, settings).stage_checkpoint("gold.chaos_revenue")
    )
    launches = Launches(spec, settings, tmp_path)
    per_chunk = CHAOS_RECORDS // CHAOS_CHUNKS
    sent: dict[tuple[int, int], dict[str, Any]] = {}  # (partition, offset) -> order

    def send_to(partition: int, orders: list[dict[str, Any]]) -> None:
        offset = sum(1 for p, _o in sent if p == partition)
        send(kafka_broker, topic, partition, orders)
        sent.update({(partition, offset + i): o for i, o in enumerate(orders)})

    def state_batch_reported(out: RunOutput, group: ProcessGroup, batch_id: int) -> None:
        deadline = time.monotonic() + 300
        while not any(
            p["stage"] == "gold.chaos_revenue" and p["batch_id"] >= batch_id for p in out.progress()
        ):
            assert group.running() and time.monotonic() < deadline, out.tail()
            time.sleep(0.2)

    window, mid_batch = Aim(AFTER_DELTA_COMMIT), Aim(MID_BATCH)
    landings: list[Landing] = []
    outputs = []
    try:
        send_to(0, chaos_orders(0, per_chunk, rng))
        with launches.run("run-0", "continuous") as (group, out):
            outputs.append(out)
            landings.append(kill_after_delta_commit(group, state, window, 8))
        send_to(1, chaos_orders(1, per_chunk, rng))
        with launches.run("run-1", "continuous") as (group, out):
            outputs.append(out)
            landings.append(kill_mid_batch(group, state, mid_batch, lambda: rng.uniform(0, 0.3), 8))
        send_to(0, chaos_orders(2, per_chunk, rng))
        if FULL_SCHEDULE:  # make chaos: a kill at a random moment after the killed batch's replay
            with launches.run("run-2", "continuous") as (group, out):
                outputs.append(out)
                state_batch_reported(out, group, landings[-1].batch_id)  # the killed one, again
                # its own generator: the data stay those of the suite's schedule for one seed
                time.sleep(random.Random(seed + 1).uniform(0.5, 3.0))
                landings.append(kill_now(group, state))
        send_to(1, chaos_orders(3, per_chunk, rng))
        send_to(1, [order(CHAOS_RECORDS, 16 * 60, "latte", 1.0)])  # 2026-11-21: the 20th closes
        # the rest in large batches: the killed batch first, with the offsets it planned
        finished, out = launches.catch_up_here(spark, chaos_spec(len(sent)))
        outputs.append(out)
        assert finished.code == EXIT_OK, out.tail()
    finally:
        print(f"kills landed: {[(k.kind, k.batch_id) for k in landings]}; KILL_SEED={seed}")
        print(f"  {window.rate()}; {mid_batch.rate()}; runs: {launches.timings}")
    assert [k.kind for k in landings[:2]] == [AFTER_DELTA_COMMIT, MID_BATCH]

    # each stateful batch's MERGE committed once; Spark's watermark dropped nothing
    twice = {key: v for key, v in state.txn_commits().items() if len(v) != 1}
    assert not twice, f"gold batches merged more than once: {twice}"
    progress = [p for out in outputs for p in out.progress()]
    stateful = [p for p in progress if p["stage"] == "gold.chaos_revenue" and p.get("state")]
    assert stateful and sum(p["state"]["rows_dropped_by_watermark"] for p in stateful) == 0
    for split in (p for p in progress if p["stage"].endswith(".split") and not p["replayed"]):
        quality = split["quality"]
        assert split["input_rows"] == quality["rows_in"] == quality["on_time"] + quality["late"]

    # every event once: in the input the stateful query read, or in the late table
    coordinates = ["_source_partition", "_source_offset"]
    input_rows = read_rows(chaos_path.with_suffix_appended("__input"), coordinates)
    late_rows = read_rows(gold_path(settings, "chaos_revenue_late"), coordinates)
    landed = sorted(
        (r["_source_partition"], r["_source_offset"]) for r in (*input_rows, *late_rows)
    )
    assert landed == sorted(sent)
    late = {(r["_source_partition"], r["_source_offset"]) for r in late_rows}
    assert late, "the orders sent 30 minutes behind were never late"
    on_time = [o for key, o in sent.items() if key not in late]
    assert read_gold(chaos_path, ["product"]) == expected_gold(on_time, TEN, None, ["product"])

    # a backfill of the closed day puts the late rows in
    first_day = date(2026, 11, 20)
    result = backfill(spark, spec, settings, "chaos_revenue", first_day, first_day)
    assert result.late_rows_covered == len(late)
    day = [o for o in sent.values() if o["ts"].date() == first_day]
    where = "_event_date = '2026-11-20'"
    assert read_gold(chaos_path, ["product"], where) == expected_gold(day, TEN, None, ["product"])

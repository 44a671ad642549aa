"""Gold without Spark: the spec section, the late rules and the late table's layout, the watermark
log, backfill refusals."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines.errors import ConfigError
from pipelines.gold.backfill import BackfillRefusedError, check_closed, closing_time
from pipelines.gold.late import EVENT_ROW, late_design, late_schema, whole_row_type
from pipelines.gold.watermark import EVENTS, WatermarkLog
from pipelines.gold.windows import MICROS, earliest_window_end_micros, is_late
from pipelines.location import Location
from pipelines.spec import SpecError, duration_seconds, parse_spec
from tests.support.gold import windows_of


def micros(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * MICROS)


def spec(**gold: Any) -> dict[str, Any]:
    table = {
        "table": "revenue",
        "event_time": "ts",
        "allowed_lateness": "5 minutes",
        "window": {"duration": "10 minutes"},
        "group_by": ["product"],
        "aggregates": [{"name": "revenue", "function": "sum", "column": "amount"}],
        **gold,
    }
    return {
        "name": "shop",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_shop"},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, product STRING, amount DOUBLE, ts TIMESTAMP",
        },
        "gold": [table],
    }


def test_a_gold_table_defaults_its_late_table_and_is_one_of_the_flows_tables() -> None:
    flow = parse_spec(spec())
    gold = flow.gold[0]
    assert gold.late.table == "revenue_late"
    assert ("gold/revenue", "revenue") in flow.tables()
    assert ("late/revenue", "revenue_late") in flow.tables()
    assert gold.input_columns() == ("product", "amount")
    assert gold.max_future_skew == "1 hour"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"group_by": ["nope"]}, "gold.0: 'nope' is not one of the columns of the events"),
        ({"event_time": "amount"}, "gold.0.event_time: 'amount' is double"),
        ({"window": {"duration": "10 minutes", "slide": "3 minutes"}}, "must divide"),
        ({"window": {"duration": "ten minutes"}}, "not a duration such as '10 minutes'"),
        ({"aggregates": [{"name": "n", "function": "sum"}]}, "sum needs a column"),
        ({"aggregates": [{"name": "_rows", "function": "count"}]}, "a column gold keeps itself"),
        ({"aggregates": []}, "is empty; give at least one"),
        ({"allowed_lateness": None}, "gold.0.allowed_lateness: is required"),
        (
            {"cluster_by": ["product"]},
            "gold.0.cluster_by: gold tables are partitioned by _event_date",
        ),
    ],
)
def test_gold_spec_errors_name_the_field_and_the_fix(change: dict[str, Any], message: str) -> None:
    data = spec(**change)
    data["gold"][0] = {k: v for k, v in data["gold"][0].items() if v is not None}
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(data, "flows/shop.yaml")


def test_a_bronze_table_cannot_take_a_stage_checkpoints_name() -> None:
    data = spec()
    data["target"] = {"table": "gold"}
    with pytest.raises(SpecError, match=r"target\.table: 'gold' is the name of a folder"):
        parse_spec(data)


def test_gold_needs_silver() -> None:
    data = spec()
    del data["silver"]
    with pytest.raises(SpecError, match="gold reads the silver events: declare a silver stage"):
        parse_spec(data)


def test_durations() -> None:
    assert duration_seconds("10 minutes") == 600
    assert duration_seconds("1 day") == 86400
    assert duration_seconds("5 seconds") == 5


def test_the_earliest_window_end_is_the_next_slide_boundary() -> None:
    ten, five = 600, 300
    assert earliest_window_end_micros(micros("2026-11-20T12:03:00"), ten) == micros(
        "2026-11-20T12:10:00"
    )
    assert earliest_window_end_micros(micros("2026-11-20T12:03:00"), five) == micros(
        "2026-11-20T12:05:00"
    )
    # a window holds start <= t < end: an event on a boundary opens the next window
    assert earliest_window_end_micros(micros("2026-11-20T12:10:00"), ten) == micros(
        "2026-11-20T12:20:00"
    )
    # the same as the first of Spark's windows (here: the reference's) that holds the event
    event = datetime(2026, 11, 20, 12, 3, tzinfo=UTC)

    first = windows_of(event, timedelta(minutes=10), timedelta(minutes=5))[0]
    assert first + timedelta(minutes=10) == datetime(2026, 11, 20, 12, 5, tzinfo=UTC)


def test_late_means_the_state_spark_would_use_is_closed() -> None:
    watermark = micros("2026-11-20T12:07:00")
    # windows: a row is late only once its (first) window has ended
    assert not is_late(micros("2026-11-20T12:01:00"), watermark, 600, deduplicate=False)
    assert is_late(micros("2026-11-20T11:59:00"), watermark, 600, deduplicate=False)
    assert is_late(micros("2026-11-20T12:01:00"), watermark, 300, deduplicate=False)
    # deduplication: Spark drops a row whose event time is not above the watermark
    assert is_late(micros("2026-11-20T12:01:00"), watermark, 600, deduplicate=True)
    assert is_late(watermark, watermark, 600, deduplicate=True)
    assert not is_late(watermark + 1, watermark, 600, deduplicate=True)
    assert not is_late(0, None, 600, deduplicate=True)  # no watermark before the first batch


def schema(*columns: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns])


def test_a_late_row_keeps_its_silver_row_whole_and_older_late_tables_grow_into_it() -> None:
    """The late table's layout (pipelines.gold.late), and how a table of the layout before it,
    without the silver row, is brought up to it: only by adding columns and struct fields."""
    events = schema(
        ("id", LongType()), ("product", StringType()), ("amount", DoubleType()),
        ("_event_time", TimestampType()), ("_source_offset", LongType()),
    )  # fmt: skip
    inputs = schema(
        ("product", StringType()), ("amount", DoubleType()), ("_event_time", TimestampType()),
        ("_source_offset", LongType()),
    )  # fmt: skip
    window = [StructField("_window_start", TimestampType())]
    late = late_schema(inputs, window, {EVENT_ROW: whole_row_type(events)}, "shop.yaml")
    assert late.fieldNames() == [
        "product", "amount", "_event_time", "_source_offset", "_event_date", "_watermark",
        "_window_start", "_split_batch_id", "_late_at", "_event",
    ]  # fmt: skip
    assert late[EVENT_ROW].dataType == whole_row_type(events)  # the silver row, its own names
    with pytest.raises(ConfigError, match="silver column '_watermark' has the name of a column"):
        late_schema(schema(("_watermark", LongType())), window, {}, "shop.yaml")

    # a windowed aggregate's table of the older layout: `_event` is added
    old = StructType([f for f in late.fields if f.name != EVENT_ROW])
    design, evolved = late_design(old, late, [EVENT_ROW])
    assert design == late and evolved == late
    assert late_design(late, late, [EVENT_ROW]) == (late, None)  # nothing to grow

    # a join's table of the older layout: `_left` held the join's columns only; it grows by the
    # silver row's other columns, its own fields first, as Delta's schema evolution adds them
    narrow = schema(("id", LongType()), ("amount", DoubleType()))
    whole = whole_row_type(events, ["id", "amount"])
    design, evolved = late_design(schema(("_left", narrow)), schema(("_left", whole)), ["_left"])
    assert evolved is not None and evolved == design
    assert design["_left"].dataType == whole
    assert [f.name for f in whole.fields] == [
        "id", "amount", "product", "_event_time", "_source_offset",
    ]  # fmt: skip
    # a field retyped is no growth: left to the table check, which refuses it, naming the reset
    retyped = schema(("id", StringType()), ("amount", DoubleType()))
    design, evolved = late_design(schema(("_left", retyped)), schema(("_left", whole)), ["_left"])
    assert evolved is None and design["_left"].dataType == whole


def test_the_watermark_log_survives_restarts_and_replays_alike(tmp_path: Path) -> None:
    log = WatermarkLog(Location.local(tmp_path), allowed_lateness_seconds=300)
    assert log.before(0) is None
    first = log.record(0, {EVENTS: micros("2026-11-20T10:31:00")})
    assert first.watermark_micros == micros("2026-11-20T10:26:00")
    log.record(1, {EVENTS: micros("2026-11-20T10:02:00")})  # older rows never lower it
    again = WatermarkLog(Location.local(tmp_path), allowed_lateness_seconds=300)  # a restart
    assert again.before(2) is not None
    assert again.before(2).watermark_micros == first.watermark_micros  # type: ignore[union-attr]
    # a replay of batch 1 is judged by batch 0's record, whatever batch 1 recorded before
    assert again.before(1) == first
    log.record(2, {EVENTS: None})  # a batch of quarantined rows only
    assert log.latest() is not None and log.latest().max_event_micros == first.max_event_micros  # type: ignore[union-attr]


def test_only_closed_dates_can_be_backfilled() -> None:
    gold = parse_spec(spec()).gold[0]
    day = date(2026, 11, 20)
    assert closing_time(day, gold) == datetime(2026, 11, 21, 0, 10, tzinfo=UTC)
    check_closed(day, day, gold, micros("2026-11-21T00:10:00"), "shop")
    with pytest.raises(
        BackfillRefusedError, match="2026-11-20 is still open: its rows are final when"
    ):
        check_closed(day, day, gold, micros("2026-11-21T00:09:59"), "shop")
    with pytest.raises(BackfillRefusedError, match="no committed stream batch yet"):
        check_closed(day, day, gold, None, "shop")
    with pytest.raises(BackfillRefusedError, match="is before --from"):
        check_closed(day, date(2026, 11, 19), gold, micros("2026-12-01T00:00:00"), "shop")


def test_gold_checks_follow_the_split_and_the_stateful_batches() -> None:
    from dagster import AssetKey

    from quality.gold_checks import LATE_ROWS, ROWS_ACCOUNTED, WATERMARK_DROPS, GoldChecks

    gold = parse_spec(spec()).gold[0]
    checks = GoldChecks(gold, AssetKey(["gold", "revenue"]))
    split = {
        "stage": "gold.revenue.split",
        "batch_id": 0,
        "input_rows": 10,
        "quality": {"rows_in": 10, "on_time": 8, "late": 0, "quarantined": 2},
        "writes": [{"role": "gold_input/revenue", "rows": 8, "skipped": False}],
    }
    assert not checks.add(split)
    assert all(checks.passed(n) for n in (ROWS_ACCOUNTED, LATE_ROWS, WATERMARK_DROPS))
    late = {**split, "batch_id": 1, "quality": {**split["quality"], "on_time": 7, "late": 1}}
    late["writes"] = [{"role": "gold_input/revenue", "rows": 7, "skipped": False}]
    assert checks.add(late)  # late rows: a warning, kept in the late table
    assert not checks.passed(LATE_ROWS) and checks.passed(ROWS_ACCOUNTED)
    wrong = {**split, "batch_id": 2, "input_rows": 11}
    assert checks.add(wrong) and not checks.passed(ROWS_ACCOUNTED)
    stateful = {"stage": "gold.revenue", "batch_id": 0, "state": {"rows_dropped_by_watermark": 3}}
    assert checks.add(stateful) and not checks.passed(WATERMARK_DROPS)
    results = {r.check_name: r for r in checks.results()}
    assert results[LATE_ROWS].severity.value == "WARN"
    assert results[WATERMARK_DROPS].severity.value == "ERROR"


def test_a_split_batch_whose_writes_disagree_with_its_counts_is_named() -> None:
    """The split's own commits must hold exactly its on-time and late rows; its appends to the
    flow's quarantine are not judged against either."""
    from quality.gold_checks import split_problems

    quality = {"rows_in": 10, "on_time": 6, "late": 3, "quarantined": 1, "filtered": 0}
    writes = [
        {"role": "gold_input/revenue", "rows": 6, "skipped": False},
        {"role": "late/revenue", "rows": 3, "skipped": False},
        {"role": "gold_quarantine/revenue", "rows": 1, "skipped": False},
    ]
    assert split_problems({"quality": quality, "input_rows": 10, "writes": writes}) == []
    writes[1] = {"role": "late/revenue", "rows": 2, "skipped": False}
    assert split_problems({"quality": quality, "writes": writes}) == [
        "the late commit added 2 rows, not 3"
    ]

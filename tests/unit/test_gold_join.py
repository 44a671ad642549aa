"""Gold joins without Spark: the spec section, the other flow it reads, the two-sided watermark,
the late rule and when a date closes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.catalog.lifecycle import refuse_started_readers
from pipelines.catalog.state import FlowState
from pipelines.errors import ConfigError
from pipelines.gold.backfill import BackfillRefusedError, check_closed, closing_time
from pipelines.gold.joins import (
    LEFT,
    RIGHT,
    common_watermarks,
    is_late,
    side_watermarks,
)
from pipelines.gold.watermark import WatermarkLog
from pipelines.gold.windows import MICROS
from pipelines.location import Location
from pipelines.settings import load_settings
from pipelines.spec import GoldJoinSpec, SpecError, join_readers, load_specs, parse_spec
from tests.unit.test_gold import micros


def orders(**join: Any) -> dict[str, Any]:
    table = {
        "table": "order_payments",
        "allowed_lateness": "5 minutes",
        "join": {
            "how": "left_outer",
            "keys": ["order_id"],
            "left": {"event_time": "ts", "columns": ["amount"]},
            "right": {
                "flow": "payments",
                "event_time": "paid_at",
                "columns": ["payment_id", "amount"],
                "prefix": "paid_",
            },
            "within": {"after": "15 minutes"},
            **join,
        },
    }
    return {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "silver": {"format": "json", "schema": "order_id BIGINT, amount DOUBLE, ts TIMESTAMP"},
        "gold": [table],
    }


PAYMENTS = {
    "name": "payments",
    "source": {"kind": "kafka", "topics": ["payments"]},
    "target": {"table": "bronze_payments"},
    "silver": {
        "format": "json",
        "schema": "payment_id BIGINT, order_id BIGINT, amount DOUBLE, paid_at TIMESTAMP",
    },
}


def folder(tmp_path: Path, *flows: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True)
    for flow in flows:
        (tmp_path / f"{flow['name']}.yaml").write_text(yaml.safe_dump(flow))
    return tmp_path


def test_a_join_is_a_gold_table_with_its_columns_and_late_table() -> None:
    gold = parse_spec(orders()).gold[0]
    assert isinstance(gold, GoldJoinSpec)
    assert gold.late.table == "order_payments_late"
    assert gold.side_columns(LEFT) == ("order_id", "amount")
    assert gold.side_columns(RIGHT) == ("order_id", "payment_id", "amount")
    assert gold.table_columns()[:4] == ("order_id", "amount", "paid_payment_id", "paid_amount")
    assert gold.closing_delay_seconds() == 15 * 60
    assert "join=left_outer" in gold.design_key()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"how": "full"}, "gold.0.join.how: unknown how 'full'; known: inner, left_outer"),
        ({"keys": []}, "gold.0.join.keys"),
        ({"within": {}}, "gold.0.join.within.after: is required"),
        ({"within": {"after": "soon"}}, "not a duration such as '10 minutes'"),
        (
            {"right": {"flow": "payments", "event_time": "paid_at", "columns": ["amount"]}},
            "gold.0.join.right.columns: 'amount' is already a column of the table (from "
            "join.left.columns): give the side a `prefix`",
        ),
        (
            {"left": {"event_time": "ts", "columns": ["_matched"]}},
            "'_matched' is a column the join keeps itself",
        ),
        (
            {"left": {"event_time": "amount"}},
            "gold.0.join.left.event_time: 'amount' is double; the event time must be a TIMESTAMP",
        ),
        ({"left": {"columns": ["nope"]}}, "gold.0.join.left: 'nope' is not one of the columns"),
        ({"keys": ["order_id", "order_id"]}, "gold.0.join.keys: 'order_id' is named twice"),
        (
            {
                "right": {
                    "flow": "payments",
                    "event_time": "paid_at",
                    "columns": ["id"],
                    "prefix": "order_",
                }
            },
            "gold.0.join.right.prefix: 'order_id' ('id' with the prefix) is a key column",
        ),
    ],
)
def test_join_spec_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(orders(**change))


def test_the_right_side_is_a_flow_beside_it_with_the_columns_the_join_reads(
    tmp_path: Path,
) -> None:
    specs = {s.name: s for s in load_specs(folder(tmp_path / "ok", orders(), PAYMENTS))}
    assert set(specs) == {"orders", "payments"}
    with pytest.raises(SpecError, match=r"join.right.flow: no flow named 'payments' among"):
        load_specs(folder(tmp_path / "alone", orders()))
    wrong = {**orders()["gold"][0]["join"]["right"], "columns": ["tip"]}
    with pytest.raises(SpecError, match=r"join.right: 'tip' is not one of the columns of the "):
        load_specs(folder(tmp_path / "tip", orders(right=wrong), PAYMENTS))


def test_the_join_watermark_is_the_least_of_both_sides_once_both_had_rows(
    tmp_path: Path,
) -> None:
    log = WatermarkLog(Location.local(tmp_path), allowed_lateness_seconds=300, sides=(LEFT, RIGHT))
    only_left = log.record(0, {LEFT: micros("2026-11-20T10:20:00"), RIGHT: None})
    assert only_left.watermark_micros is None  # Spark's stays at the epoch until then
    both = log.record(1, {LEFT: None, RIGHT: micros("2026-11-20T10:30:00")})
    assert both.watermark_micros == micros("2026-11-20T10:15:00")
    assert both.max_by_side == {
        LEFT: micros("2026-11-20T10:20:00"),
        RIGHT: micros("2026-11-20T10:30:00"),
    }
    restarted = WatermarkLog(Location.local(tmp_path), 300, sides=(LEFT, RIGHT))  # a restart
    assert restarted.before(2) == both


def test_without_the_join_running_both_sides_are_judged_by_the_least_watermark(
    tmp_path: Path,
) -> None:
    five = 300 * MICROS
    before = {LEFT: micros("2026-11-20T10:20:00"), RIGHT: micros("2026-11-20T10:30:00")}
    assert common_watermarks(before, five) == {
        LEFT: micros("2026-11-20T10:15:00"),
        RIGHT: micros("2026-11-20T10:15:00"),
    }
    assert common_watermarks({LEFT: before[LEFT], RIGHT: None}, five) == {LEFT: 0, RIGHT: 0}
    # the choice between the two rules is made once per batch: a replay reads it back
    log = WatermarkLog(Location.local(tmp_path), 300, sides=(LEFT, RIGHT))
    assert log.decision(3, lambda: {"join_running": True}) == {"join_running": True}
    assert log.decision(3, lambda: {"join_running": False}) == {"join_running": True}


def test_each_side_is_judged_with_the_other_sides_rows_of_the_batch_counted() -> None:
    five = 300 * MICROS
    before = {LEFT: micros("2026-11-20T10:20:00"), RIGHT: micros("2026-11-20T10:30:00")}
    # the batch's own left rows reach 10:40: the join's right branch may read them a batch
    # before the left one reads the right rows, so right rows are judged by min(10:40, 10:30)
    batch = {LEFT: micros("2026-11-20T10:40:00"), RIGHT: micros("2026-11-20T10:25:00")}
    watermarks = side_watermarks(before, batch, five)
    assert watermarks == {
        LEFT: micros("2026-11-20T10:15:00"),  # min(10:20 before, 10:30 with the batch) - 5
        RIGHT: micros("2026-11-20T10:25:00"),  # min(10:30 before, 10:40 with the batch) - 5
    }
    assert is_late(micros("2026-11-20T10:25:00"), watermarks[RIGHT])
    assert not is_late(micros("2026-11-20T10:25:00") + 1, watermarks[RIGHT])
    # a side without rows yet: the epoch, where Spark's watermark stands
    assert side_watermarks({LEFT: before[LEFT]}, {}, five) == {LEFT: 0, RIGHT: 0}
    assert side_watermarks({}, batch, five) == {LEFT: 0, RIGHT: 0}
    assert is_late(0, 0) and not is_late(1, 0)


def test_a_join_date_closes_when_the_watermark_passes_it_plus_the_bound() -> None:
    gold = parse_spec(orders()).gold[0]
    day = date(2026, 11, 20)
    assert closing_time(day, gold) == datetime(2026, 11, 21, 0, 15, tzinfo=UTC)
    check_closed(day, day, gold, micros("2026-11-21T00:15:00"), "orders")
    with pytest.raises(BackfillRefusedError, match="final when the watermark passes"):
        check_closed(day, day, gold, micros("2026-11-21T00:14:59"), "orders")


def test_a_reset_of_events_a_started_join_reads_is_refused(tmp_path: Path) -> None:
    specs = {s.name: s for s in load_specs(folder(tmp_path / "flows", orders(), PAYMENTS))}
    settings = replace(load_settings(), runtime_dir=tmp_path / "runtime")
    assert [(r.name, g.table) for r, g in join_readers(specs["payments"])] == [
        ("orders", "order_payments")
    ]
    refuse_started_readers(specs["payments"], settings, "reset")  # the join never ran: fine
    split = FlowState.of(specs["orders"], settings).stage_checkpoint("gold.order_payments.split")
    (split / "offsets").mkdir(parents=True)
    (split / "offsets" / "0").write_text("v1\n{}\n")
    with pytest.raises(ConfigError, match="conflux reset orders --stage gold"):
        refuse_started_readers(specs["payments"], settings, "reset")

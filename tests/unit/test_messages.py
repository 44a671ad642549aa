"""The data plane's messages to the control plane (no Spark, no Dagster): every kind round-trips
through JSON, a ``_status.json`` written by the previous version reads, bad input names its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipelines.messages import (
    BatchCommitted,
    BatchQuality,
    ErrorReported,
    ExpectationCount,
    FlowStopped,
    GoldQuality,
    Message,
    MessageError,
    StageStarted,
    StopReason,
    TableWrite,
    parse_message,
)
from pipelines.status import FlowStatus

#: A silver batch's ``_status.json`` exactly as the previous version wrote it
#: (``Reporter.batch``: ``{**{"owner": owner}, "last_batch": {"type": "batch", **asdict(progress)}}``,
#: json.dump with sort_keys and indent 2).
SILVER_STATUS = """{
  "last_batch": {
    "batch_duration_ms": 2210,
    "batch_id": 12,
    "delta_version": 14,
    "end_offsets": {
      "index": -1,
      "isStartingVersion": false,
      "reservoirId": "0f5d8d0e-4c1b-4a8e-9a55-1f7c2b8a9e10",
      "reservoirVersion": 31,
      "sourceVersion": 1
    },
    "flow": "people",
    "input_rows": 10,
    "input_rows_per_second": 4.2,
    "lag": null,
    "lag_versions": 0,
    "latest_offsets": null,
    "partition_lag": null,
    "processed_rows_per_second": 4.5,
    "quality": {
      "columns_added": [],
      "dropped": 1,
      "events": 7,
      "expectations": [
        {
          "action": "drop",
          "expectation": "amount > 0",
          "failed": 1,
          "name": "positive"
        }
      ],
      "ignored": 1,
      "passed": 6,
      "quarantined": 2,
      "rescued": 0,
      "rows_in": 10,
      "schema_mismatches": 0,
      "warned": 1,
      "written": 7
    },
    "replayed": false,
    "rows_added": 7,
    "stage": "silver",
    "state": null,
    "timestamp": "2025-06-02T09:14:03.512Z",
    "type": "batch",
    "writes": [
      {
        "role": "events",
        "rows": 7,
        "skipped": false,
        "table": "silver_people_events",
        "version": 13
      },
      {
        "role": "quarantine",
        "rows": 2,
        "skipped": false,
        "table": "silver_people_quarantine",
        "version": 9
      },
      {
        "role": "current",
        "rows": 5,
        "skipped": false,
        "table": "people",
        "version": 14
      },
      {
        "role": "deleted_keys",
        "rows": 1,
        "skipped": false,
        "table": "people__deleted_keys",
        "version": 3
      },
      {
        "role": "history",
        "rows": 6,
        "skipped": false,
        "table": "people_history",
        "version": 11
      }
    ]
  },
  "owner": "runner-3f2a9c1b7e4d"
}
"""

#: A bronze batch of a Kafka flow, as the previous version wrote it.
BRONZE_STATUS: dict[str, Any] = {
    "owner": "dagster-0a1b2c3d4e5f",
    "last_batch": {
        "type": "batch",
        "flow": "orders",
        "stage": "bronze",
        "batch_id": 4,
        "input_rows": 300,
        "rows_added": 300,
        "replayed": False,
        "input_rows_per_second": 120.3,
        "processed_rows_per_second": 98.1,
        "batch_duration_ms": 3057,
        "end_offsets": {"orders": {"0": 150, "1": 150}},
        "latest_offsets": {"orders": {"0": 160, "1": 150}},
        "lag": 10,
        "partition_lag": {"orders-0": 10, "orders-1": 0},
        "delta_version": 5,
        "timestamp": "2025-06-02T09:14:03.512Z",
        "writes": [
            {
                "table": "bronze_orders",
                "role": "bronze",
                "version": 5,
                "rows": 300,
                "skipped": False,
            }
        ],
        "quality": None,
        "lag_versions": None,
        "state": None,
    },
}

#: A status file of a runner from before silver: no stage, writes, quality, state, lag_versions.
PRE_SILVER_STATUS: dict[str, Any] = {
    "owner": "cli-5e6f7a8b9c0d",
    "last_batch": {
        "type": "batch",
        "flow": "orders",
        "batch_id": 2,
        "input_rows": 50,
        "rows_added": 0,
        "replayed": True,
        "input_rows_per_second": 10.0,
        "processed_rows_per_second": 12.5,
        "batch_duration_ms": 4000,
        "end_offsets": {"orders": {"0": 50}},
        "latest_offsets": {"orders": {"0": 50}},
        "lag": 0,
        "partition_lag": {"orders-0": 0},
        "delta_version": 3,
        "timestamp": "2024-11-20T17:02:44.001Z",
    },
}


def write(role: str, table: str, version: int | None = 1, rows: int = 3) -> TableWrite:
    return TableWrite(table, role, version, rows, skipped=version is None)


def committed(stage: str, **fields: Any) -> BatchCommitted:
    base: dict[str, Any] = {
        "flow": "orders",
        "stage": stage,
        "batch_id": 7,
        "input_rows": 10,
        "rows_added": 8,
        "replayed": False,
        "input_rows_per_second": 1.5,
        "processed_rows_per_second": 2.5,
        "batch_duration_ms": 1200,
        "end_offsets": {"orders": {"0": 10}},
        "latest_offsets": {"orders": {"0": 12}},
        "lag": 2,
        "partition_lag": {"orders-0": 2},
        "delta_version": 4,
        "timestamp": "2025-06-02T09:14:03.512Z",
    }
    return BatchCommitted(**{**base, **fields})


SILVER_QUALITY = BatchQuality(
    rows_in=10, events=7, quarantined=2, ignored=1, passed=5, warned=1, dropped=1,
    schema_mismatches=1, rescued=2, written=6,
    expectations=(ExpectationCount("positive", "fail", 0, "amount > 0"),),
    columns_added=("tier STRING",),
)  # fmt: skip
GOLD_QUALITY = GoldQuality(
    rows_in=9, on_time=5, late=2, quarantined=1, filtered=1, null_event_time=1,
    future_event_time=0, next_watermark="2025-06-02T09:00:00+00:00",
    max_event_time="2025-06-02T09:10:00+00:00",
    watermarks={
        "watermark": "2025-06-02T08:50:00+00:00",
        "watermark_left": "2025-06-02T08:50:00+00:00",
        "watermark_right": None,
        "join_running": True,
    },
)  # fmt: skip

MESSAGES: list[Message] = [
    committed("bronze", writes=(write("bronze", "bronze_orders"),)),
    committed(
        "silver",
        lag=None,
        partition_lag=None,
        lag_versions=3,
        end_offsets={"reservoirVersion": 4, "index": -1},
        latest_offsets=None,
        writes=(
            write("events", "silver_orders_events"),
            write("quarantine", "silver_orders_quarantine", rows=2),
            write("current", "orders_current"),
            write("deleted_keys", "orders_current__deleted_keys", version=None, rows=0),
            write("history", "orders_history", rows=4),
        ),
        quality=SILVER_QUALITY,
    ),
    committed(
        "gold.daily.split",
        writes=(write("gold_input/daily", "gold_daily__input"), write("late/daily", "late_daily")),
        quality=GOLD_QUALITY,
    ),
    committed(
        "gold.daily",
        replayed=True,
        writes=(write("gold/daily", "gold_daily", version=None, rows=0),),
        state={"watermark": "2025-06-02T09:00:00.000Z", "rows_total": 4, "operators": []},
    ),
    StageStarted("orders", "silver", "orders.silver"),
    *(
        FlowStopped("orders", reason, f"why: {reason.value}", "orders.silver")
        for reason in StopReason
    ),
    FlowStopped("orders", StopReason.EXPECTATION_FAILED, "flow x", "orders.silver", ("a", "b")),
    FlowStopped("orders", StopReason.FINISHED),
    ErrorReported("flow orders failed: boom"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"{type(m).__name__}")
def test_every_message_round_trips_through_json(message: Message) -> None:
    wire = json.loads(json.dumps(message.to_json()))
    assert parse_message(wire) == message
    assert type(message).parse(wire) == message


@pytest.mark.parametrize("reason", list(StopReason))
def test_every_stop_reason_round_trips(reason: StopReason) -> None:
    stopped = FlowStopped("orders", reason, "m", "orders", ("x",))
    assert parse_message(json.loads(json.dumps(stopped.to_json()))) == stopped
    assert stopped.to_json()["reason"] == reason.value


def test_only_policy_stops_repeat_on_restart() -> None:
    assert {r for r in StopReason if r.repeats_on_restart} == {
        StopReason.EXPECTATION_FAILED,
        StopReason.SCHEMA_CHANGE_REFUSED,
    }


def test_a_status_file_of_the_previous_version_reads_and_writes_back_unchanged() -> None:
    for written in (json.loads(SILVER_STATUS), BRONZE_STATUS):
        status = FlowStatus.parse(written)
        assert status.to_json() == written
    silver = FlowStatus.parse(json.loads(SILVER_STATUS))
    assert silver.owner == "runner-3f2a9c1b7e4d"
    last = silver.last_batch
    assert last is not None and last.is_silver and last.batch_id == 12
    assert [w.role for w in last.writes] == [
        "events", "quarantine", "current", "deleted_keys", "history",
    ]  # fmt: skip
    assert last.writes[-1] == TableWrite("people_history", "history", 11, 6, False)
    assert isinstance(last.quality, BatchQuality)
    assert last.quality.expectations[0] == ExpectationCount("positive", "drop", 1, "amount > 0")
    bronze = FlowStatus.parse(BRONZE_STATUS).last_batch
    assert (
        bronze is not None
        and bronze.is_bronze
        and bronze.partition_lag
        == {
            "orders-0": 10,
            "orders-1": 0,
        }
    )


def test_a_status_file_of_a_runner_from_before_silver_reads() -> None:
    status = FlowStatus.parse(PRE_SILVER_STATUS)
    last = status.last_batch
    assert last is not None
    assert (last.stage, last.batch_id, last.delta_version, last.replayed) == ("bronze", 2, 3, True)
    assert last.writes == () and last.quality is None and last.state is None
    assert FlowStatus.parse({}) == FlowStatus()
    assert FlowStatus.parse({"owner": "a", "last_batch": None}) == FlowStatus("a")


def test_a_silver_quality_of_an_older_runner_takes_defaults() -> None:
    quality = BatchQuality.parse({"rows_in": 3, "events": 2, "quarantined": 1, "ignored": 0})
    assert (quality.written, quality.rescued, quality.expectations) == (2, 0, ())


def test_the_stage_says_whose_batch_it_is() -> None:
    assert committed("bronze").is_bronze and committed("bronze").gold_table is None
    assert committed("silver").is_silver
    split, state = committed("gold.daily.split"), committed("gold.daily")
    assert (split.gold_table, split.is_gold_split) == ("daily", True)
    assert (state.gold_table, state.is_gold_split) == ("daily", False)


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"type": "nope"}, "unknown type 'nope'"),
        ([1, 2], "must be a JSON object"),
        ({"type": "batch", "flow": "a"}, "field 'batch_id' is missing"),
        ({"type": "batch", "flow": "a", "batch_id": "x"}, "field 'batch_id' = 'x'"),
        ({"type": "batch", "flow": "a", "batch_id": 1, "writes": [{"role": "bronze"}]},
         "a batch's table write: field 'table' is missing"),
        ({"type": "batch", "flow": "a", "batch_id": 1, "quality": {"rows_in": 1}},
         "stage 'bronze' has a quality report"),
        ({"type": "flow_stopped", "flow": "a", "reason": "tired"}, "field 'reason' = 'tired'"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_is_named(data: Any, names: str) -> None:
    with pytest.raises(MessageError) as error:
        parse_message(data)
    assert names in str(error.value)

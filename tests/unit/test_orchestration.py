"""The orchestration surface without a JVM: ownership and schedules from the spec, the scheduled
backfill's dates, stream health, column lineage, table facts read by delta-rs, restarts and the
backfill progress bar."""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import (
    AssetKey,
    Backoff,
    DefaultScheduleStatus,
    build_schedule_context,
)
from deltalake import DeltaTable, write_deltalake

from assets.builder import build_definitions
from assets.flows import restart_policy
from assets.lineage import column_lineage
from assets.table_facts import TableFacts
from pipelines.catalog.state import FlowState
from pipelines.gold.backfill import last_closed_dates
from pipelines.health import DELTA_END_INDEX, HeartbeatWriter, assess, delta_lag, read_health
from pipelines.job_progress import TaskCounts, task_counts
from pipelines.location import Location
from pipelines.settings import PROJECT_ROOT, load_settings
from pipelines.spec import SpecError, load_specs, parse_spec

NEVER = "0 0 1 1 *"


def sales(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "sales",
        "domain": "shop",
        "owners": ["team:data", "ana@example.com"],
        "tags": {"tier": "gold"},
        "source": {"kind": "kafka", "topics": ["sales"]},
        "target": {"table": "bronze_sales"},
        "trigger": {"mode": "available_now", "schedule": NEVER},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, product STRING, amount DOUBLE, ts TIMESTAMP",
        },
        "gold": [
            {
                "table": "sales_1h",
                "event_time": "ts",
                "allowed_lateness": "10 minutes",
                "window": {"duration": "1 hour"},
                "group_by": ["product"],
                "aggregates": [{"name": "revenue", "function": "sum", "column": "amount"}],
                "backfill": {"schedule": "30 2 * * *", "dates": 3},
            }
        ],
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"owners": ["data team"]}, "owners: 'data team' is neither an email nor `team:<name>`"),
        (
            {"tags": {"tier": "gold reporting"}},
            "tags: tag 'tier': 'gold reporting' is not a Dagster tag",
        ),
        ({"domain": "the shop"}, "domain: 'the shop' is not a valid identifier"),
        (
            {"trigger": {"mode": "continuous", "schedule": NEVER}},
            "trigger.schedule: a continuous flow runs until stopped",
        ),
        (
            {"trigger": {"mode": "continuous", "stale_after": "10 seconds"}},
            "trigger.stale_after: '10 seconds' is shorter than 30 seconds",
        ),
        ({"trigger": {"schedule": "every day"}}, "trigger.schedule: 'every day' is not a cron"),
    ],
)
def test_ownership_and_schedule_errors_name_the_field(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(sales(**overrides), where="flows/sales.yaml")
    assert str(caught.value).startswith(f"flows/sales.yaml: {message}"), str(caught.value)


def write(folder: Path, *specs: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        (folder / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    return folder


def test_groups_owners_tags_and_schedules_come_from_the_spec(tmp_path: Path) -> None:
    plain = {"name": "plain", "source": {"kind": "kafka", "topics": ["plain"]},
             "target": {"table": "bronze_plain"}}  # fmt: skip
    defs = build_definitions(write(tmp_path / "flows", sales(), plain))
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        flow = node.tags.get("conflux/flow")
        assert node.group_name == {"sales": "shop", "plain": "plain"}[flow], key
        if flow == "sales":
            assert set(node.owners) == {"team:data", "ana@example.com"}, key
            assert node.tags["tier"] == "gold", key
    assert graph.get(AssetKey(["gold", "sales_1h"])).tags["conflux/layer"] == "gold"
    schedules = {s.name: s for s in defs.schedules or []}
    assert set(schedules) == {"run_sales_schedule", "backfill_sales_1h_schedule"}
    assert schedules["run_sales_schedule"].cron_schedule == NEVER
    assert schedules["backfill_sales_1h_schedule"].cron_schedule == "30 2 * * *"
    for schedule in schedules.values():
        assert schedule.default_status == DefaultScheduleStatus.RUNNING
        assert schedule.execution_timezone == "UTC"


def no_cron_literal_in(folder: Path) -> list[str]:
    cron = r"cron_schedule=\""
    return [str(p) for p in folder.rglob("*.py") if cron in p.read_text().replace(" ", "")]


def test_no_cron_literal_in_python() -> None:
    assert no_cron_literal_in(PROJECT_ROOT / "assets") == []


def write_watermark(checkpoint: Location, watermark: datetime) -> None:
    """A committed batch 0 of a stateful query whose watermark is ``watermark``."""
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    metadata = {"batchWatermarkMs": int(watermark.timestamp() * 1000), "batchTimestampMs": 0}
    (checkpoint / "offsets" / "0").write_text(f"v1\n{json.dumps(metadata)}\n{{}}\n")
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_scheduled_backfill_asks_for_the_newest_closed_dates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jars = load_settings().jars_dir
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("CONFLUX_JARS_DIR", str(jars))
    defs = build_definitions(write(tmp_path / "flows", sales()))
    schedule = defs.get_schedule_def("backfill_sales_1h_schedule")
    context = build_schedule_context(
        scheduled_execution_time=datetime(2026, 3, 9, 2, 30, tzinfo=UTC)
    )
    assert isinstance(schedule.evaluate_tick(context).skip_message, str)  # never committed

    [spec] = load_specs(tmp_path / "flows")
    checkpoint = FlowState.of(spec, load_settings()).stage_checkpoint("gold.sales_1h")
    write_watermark(checkpoint, datetime(2026, 3, 9, 0, 50, tzinfo=UTC))  # 03-08 closes at 01:00
    [request] = schedule.evaluate_tick(context).run_requests or []
    assert request.tags["dagster/asset_partition_range_start"] == "2026-03-05"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-03-07"
    assert request.run_key == "2026-03-05..2026-03-07@2026-03-09T02:30:00+00:00"


def test_last_closed_dates_never_precede_the_first_partition() -> None:
    gold = parse_spec(sales()).gold[0]
    micros = int(datetime(2025, 1, 2, 3, 0, tzinfo=UTC).timestamp() * 1e6)
    assert last_closed_dates(gold, micros, 5) == (date(2025, 1, 1), date(2025, 1, 1))
    assert (
        last_closed_dates(gold, int(datetime(2025, 1, 1, 12, tzinfo=UTC).timestamp() * 1e6), 3)
        is None
    )
    assert last_closed_dates(gold, None, 3) is None


def test_health_of_a_flow_from_its_heartbeat() -> None:
    now = 10_000.0

    def query(lag: int | None, event_age: float, commit_age: float) -> dict[str, Any]:
        return {"lag": lag, "lag_unit": "records", "last_event_at": now - event_age,
                "last_commit_at": now - commit_age, "started_at": now - 900}  # fmt: skip

    def doc(**queries: dict[str, Any]) -> dict[str, Any]:
        return {"owner": "o", "heartbeat_at": now - 1, "stopped_at": None, "queries": queries,
                "host": "elsewhere", "pid": "1"}  # fmt: skip

    idle = assess(doc(bronze=query(0, 5, 500)), 60, since=now - 900, now=now)
    assert (idle.state, idle.healthy) == ("healthy", True)  # idle, lag 0, heard 5 s ago
    stalled = assess(doc(bronze=query(40, 5, 90)), 60, since=now - 900, now=now)
    assert (stalled.state, stalled.healthy) == ("stalled", False)
    assert "bronze is 40 records behind" in stalled.reason
    assert assess(doc(bronze=query(40, 5, 2)), 60, since=now - 900, now=now).healthy  # catching up
    one_stuck = assess(doc(bronze=query(0, 1, 500), silver=query(None, 75, 500)), 60,
                       since=now - 900, now=now)  # fmt: skip
    assert one_stuck.state == "stale" and "nothing heard from silver for 75 s" in one_stuck.reason
    assert assess(None, 60, since=now - 30, now=now).state == "starting"
    assert assess(None, 60, since=now - 61, now=now).state == "stale"
    stopped = {**doc(bronze=query(0, 5, 5)), "stopped_at": now - 1}
    assert assess(stopped, 60, since=now - 900, now=now).state == "stopped"


def test_the_heartbeat_file_is_this_runs_only(tmp_path: Path) -> None:
    path = Location.local(tmp_path / "_health.json")
    writer = HeartbeatWriter({"sales": path}, owner="run-1")
    writer.beat("sales", "sales", event="started")
    writer.beat("sales", "sales", committed_batch=3, lag=0, lag_unit="records")
    doc = read_health(path, "run-1")
    assert doc is not None and doc["queries"]["sales"]["last_batch_id"] == 3
    assert read_health(path, "run-2") is None  # another run's file is not its heartbeat
    writer.stopped()
    assert assess(read_health(path, "run-1"), 60, since=time.time()).state == "stopped"


def test_delta_lag_counts_versions_not_fully_read() -> None:
    assert delta_lag({"reservoirVersion": 5, "index": -1}, 7) == 3  # 5, 6 and 7 unread
    assert delta_lag({"reservoirVersion": 7, "index": 3}, 7) == 1  # 7 read in part
    assert delta_lag({"reservoirVersion": 7, "index": DELTA_END_INDEX}, 7) == 0
    assert delta_lag({"reservoirVersion": 8, "index": -1}, 7) == 0  # read up to the end
    assert delta_lag(None, 7) is None and delta_lag({"reservoirVersion": 1}, None) is None


def test_restarts_only_for_continuous_flows() -> None:
    continuous = parse_spec(sales(trigger={"mode": "continuous", "max_restarts": 3,
                                           "restart_delay": "5 seconds"}))  # fmt: skip
    policy = restart_policy(continuous)
    assert policy is not None
    assert (policy.max_retries, policy.delay, policy.backoff) == (3, 5, Backoff.EXPONENTIAL)
    assert restart_policy(parse_spec(sales())) is None
    assert (
        restart_policy(parse_spec(sales(trigger={"mode": "continuous", "max_restarts": 0}))) is None
    )


def test_column_lineage_follows_the_spec() -> None:
    [orders] = [s for s in load_specs(PROJECT_ROOT / "flows") if s.name == "orders"]
    lineage = column_lineage(orders)

    def deps(table: list[str], column: str) -> list[tuple[str, str]]:
        found = lineage[AssetKey(table)].deps_by_column[column]
        return [(d.asset_key.to_user_string(), d.column_name) for d in found]

    assert deps(["silver", "silver_orders_events"], "amount") == [("bronze/bronze_orders", "value")]
    assert deps(["gold", "revenue_10m"], "revenue") == [("silver/silver_orders_events", "amount")]
    assert deps(["gold", "revenue_10m"], "window_start") == [
        ("silver/silver_orders_events", "event_time")
    ]
    assert deps(["gold", "order_payments"], "order_id") == [
        ("silver/silver_orders_events", "order_id"),
        ("silver/silver_payments_events", "order_id"),
    ]
    assert deps(["gold", "order_payments"], "method") == [
        ("silver/silver_payments_events", "method")
    ]
    transformed = parse_spec(sales(silver={**sales()["silver"], "transform": "a.b:c"}))
    assert column_lineage(transformed) == {}  # a transform may change any column: no guess


def test_table_facts_read_by_delta_rs(tmp_path: Path) -> None:
    path = tmp_path / "t"
    facts = TableFacts(Location.local(path))
    assert facts.read() == {}
    write_deltalake(str(path), pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}))
    write_deltalake(str(path), pa.table({"id": [4], "name": ["d"]}), mode="append")
    read = facts.read()
    assert read["dagster/row_count"].value == 4
    assert read["table_version"].value == 1
    assert [(c.name, c.type) for c in read["dagster/column_schema"].columns] == [
        ("id", "long"),
        ("name", "string"),
    ]
    history = [r.data for r in read["history"].records]
    assert [(h["version"], h["rows_written"]) for h in history] == [(1, 1), (0, 3)]
    write_deltalake(str(path), pa.table({"id": [5], "name": ["e"]}), mode="append")
    assert facts.read()["dagster/row_count"].value == 5  # the open table follows new commits
    (path / "_delta_log" / "00000000000000000003.json").write_text("not json")
    assert "delta-rs could not read" in facts.read()["table_facts"].value  # a note, no error


def test_a_table_with_deletion_vectors_is_counted_by_a_scan(tmp_path: Path) -> None:
    path = str(tmp_path / "dv")
    write_deltalake(
        path,
        pa.table({"id": [1, 2, 3]}),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    DeltaTable(path).delete("id = 2")
    assert TableFacts(Location.local(path)).read()["dagster/row_count"].value == 2


class FakeTracker:
    """Spark's status tracker: jobs (id -> stage ids) and stages (id -> tasks, done); active
    stages are those listed in ``active``."""

    def __init__(self, jobs: dict[int, list[int]], stages: dict[int, tuple[int, int]],
                 active: set[int]) -> None:  # fmt: skip
        self.jobs, self.stages, self.active = jobs, stages, active

    def getJobIdsForGroup(self) -> list[int]:  # noqa: N802 - Spark's API
        return list(self.jobs)

    def getJobInfo(self, job_id: int) -> Any:  # noqa: N802
        return type("Job", (), {"stageIds": self.jobs[job_id]})()

    def getActiveStageIds(self) -> list[int]:  # noqa: N802
        return sorted(self.active)

    def getStageInfo(self, stage_id: int) -> Any:  # noqa: N802
        total, done = self.stages[stage_id]
        return type("Stage", (), {"numTasks": total, "numCompletedTasks": done})()


def test_the_progress_bar_counts_tasks_of_every_stage_of_the_jobs_since_it_started() -> None:
    stages = {0: (9, 9), 1: (4, 4), 2: (10, 3), 3: (2, 0)}
    seen: dict[int, tuple[int, int]] = {}
    running = FakeTracker({0: [0], 1: [1, 2]}, stages, active={2})
    assert task_counts(running, seen, first_job=1) == TaskCounts(2, 14, 7)  # job 0 was before
    later = FakeTracker({0: [0], 1: [1, 2], 2: [3]}, stages, active={3})
    assert task_counts(later, seen, first_job=1) == TaskCounts(3, 16, 14)  # stage 2 finished
    assert TaskCounts(3, 16, 8).bar("backfill", 12.0) == (
        "backfill [###############...............] 8/16 tasks of 3 stage(s), 12 s"
    )

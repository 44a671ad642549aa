"""The whole medallion in the Dagster UI, driven as a person drives it, on a real `dagster dev`.

* The asset graph (through the GraphQL API the UI calls): source -> bronze -> silver events and
  quarantine -> gold and late data -> the gold table's daily-partitioned backfill asset, grouped
  by the spec's domain with its owners and tags, with the gold checks; the schedules are the
  spec's crons; the scheduled backfill, evaluated as the UI's "Test schedule" does, asks for the
  newest closed dates under the stream's real watermark.
* Through GraphQL: a materialization of the flow; the tables' materializations carry their
  schema, row count, lineage and Delta history, the gold checks pass.
* In a real headless Chromium: Materialize on the bronze asset runs the whole flow again (late
  rows land in the late table); the gold asset's backfill dialog launches a range of three dates,
  one run; it succeeds, with screenshots kept as artifacts. Afterwards every date of the gold
  table equals a plain-Python aggregate of all its events, late ones included.
* Through GraphQL: a backfill of a date still open is refused with the time it closes.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterRunStatus, RunsFilter

from pipelines.catalog.tables import declared_paths
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.support.browser import browser
from tests.support.dagster_ui import DagsterUI, wait_for
from tests.support.delta_read import read_rows
from tests.support.gold import expected_gold, read_gold
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(1200)
FLOW, GOLD = "ui_sales", "ui_sales_1h"
NEVER = "0 0 1 1 *"  # a yearly cron: the schedules exist, and do not fire during the test
TODAY = datetime.now(UTC).date()
DATES = [TODAY - timedelta(days=d) for d in (6, 5, 4, 3)]
LATE_DATES = {DATES[1]: 3, DATES[2]: 2}
GOLD_CHECKS = ("rows_accounted", "late_rows", "watermark_drops")


def event(i: int, day: date, minute: int) -> dict[str, Any]:
    ts = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(minutes=minute)
    return {"id": i, "product": "ab"[i % 2], "amount": round(1 + i * 0.25, 2), "ts": ts}


def spec() -> dict[str, Any]:
    return {
        "name": FLOW,
        "description": "Sales for the UI tests.",
        "domain": "ui_shop",
        "owners": ["team:ui-tests", "owner@example.com"],
        "tags": {"tier": "test"},
        "source": {"kind": "kafka", "topics": [FLOW]},
        "target": {"table": f"bronze_{FLOW}"},
        "trigger": {"mode": "available_now", "schedule": NEVER},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, product STRING, amount DOUBLE, ts TIMESTAMP",
            "event_time": "ts",
        },
        "gold": [
            {
                "table": GOLD,
                "event_time": "ts",
                "allowed_lateness": "10 minutes",
                "window": {"duration": "1 hour"},
                "group_by": ["product"],
                "aggregates": [
                    {"name": "revenue", "function": "sum", "column": "amount"},
                    {"name": "orders", "function": "count"},
                ],
                "partitions_start": (TODAY - timedelta(days=30)).isoformat(),
                "backfill": {"schedule": NEVER, "dates": 3},
            }
        ],
    }


class SalesFlow:
    """The flow's events: 12 per date on time and one that closes the dates (sent first), then
    late ones (sent after the first run moved the watermark past them)."""

    def __init__(self, ui_flows: Path, settings: Settings) -> None:
        spec_file = ui_flows / f"{FLOW}.yaml"
        spec_file.write_text(yaml.safe_dump(spec(), sort_keys=False))
        self.paths = declared_paths(load_spec(spec_file), settings)
        self.on_time = [event(i * 4 + d, day, 5 + 50 * i) for d, day in enumerate(DATES)
                        for i in range(12)]  # fmt: skip
        closer = event(900, TODAY - timedelta(days=1), 12 * 60)
        self.late = [event(800 + n, day, 7 + 13 * n) for day, count in LATE_DATES.items()
                     for n in range(count)]  # fmt: skip
        self.sent = [*self.on_time, closer]

    def send(self, bootstrap: str, events: list[dict[str, Any]]) -> None:
        records = [
            (str(e["id"]).encode(), json.dumps({**e, "ts": e["ts"].isoformat()}).encode())
            for e in events
        ]
        produce(bootstrap, FLOW, records, partition=0)
        self.sent += [e for e in events if e not in self.sent]

    def expected(self, days: list[date]) -> dict[Any, dict[str, float]]:
        """Plain-Python aggregates of every event (late ones included) of ``days``."""
        events = [e for e in self.sent if e["ts"].date() in days]
        return {
            key: {"revenue": row["revenue"], "orders": row["orders"], "_rows": row["_rows"]}
            for key, row in expected_gold(events, timedelta(hours=1), None, ["product"]).items()
        }

    def gold(self, days: list[date]) -> dict[Any, dict[str, float]]:
        where = " OR ".join(f"_event_date = DATE '{d.isoformat()}'" for d in days)
        return {
            key: {"revenue": row["revenue"], "orders": row["orders"], "_rows": row["_rows"]}
            for key, row in read_gold(self.paths[f"gold/{GOLD}"], ["product"], where).items()
        }


@pytest.fixture(scope="module")
def sales(
    dagster_ui: DagsterUI, ui_flows: Path, kafka_broker: KafkaBroker, spark_settings: Settings
) -> SalesFlow:
    flow = SalesFlow(ui_flows, spark_settings)
    create_topic(kafka_broker.bootstrap_servers, FLOW, partitions=1)
    flow.send(kafka_broker.bootstrap_servers, flow.sent)
    dagster_ui.reload()
    return flow


def test_the_asset_graph_groups_owners_checks_and_schedules_come_from_the_spec(
    dagster_ui: DagsterUI, sales: SalesFlow
) -> None:
    nodes = dagster_ui.asset_nodes()
    upstream = {
        "kafka/ui_sales": set(),
        "bronze/bronze_ui_sales": {"kafka/ui_sales"},
        "silver/silver_ui_sales_events": {"bronze/bronze_ui_sales"},
        "quarantine/silver_ui_sales_quarantine": {"bronze/bronze_ui_sales"},
        f"gold/{GOLD}": {"silver/silver_ui_sales_events"},
        f"late/{GOLD}_late": {"silver/silver_ui_sales_events"},
        f"backfill/{GOLD}": {"silver/silver_ui_sales_events", f"gold/{GOLD}", f"late/{GOLD}_late"},
    }
    for key, deps in upstream.items():
        node = nodes[key]
        assert {"/".join(d["path"]) for d in node["dependencyKeys"]} == deps, key
        assert node["groupName"] == "ui_shop", key
        owners = {o.get("team") or o.get("email") for o in node["owners"]}
        assert owners == {"ui-tests", "owner@example.com"}, key
        tags = {t["key"]: t["value"] for t in node["tags"]}
        assert tags["tier"] == "test" and tags["conflux/flow"] == FLOW, key
    assert nodes[f"backfill/{GOLD}"]["isPartitioned"]
    assert not nodes[f"gold/{GOLD}"]["isPartitioned"]  # the stream writes every date at once
    gold_checks = {c["name"] for c in nodes[f"gold/{GOLD}"]["assetChecksOrError"]["checks"]}
    assert set(GOLD_CHECKS) <= gold_checks
    assert nodes["bronze/bronze_ui_sales"]["description"] == "Sales for the UI tests."

    repository = dagster_ui.repository()
    schedules = {s["name"]: s for s in repository["schedules"]}
    for name in (f"run_{FLOW}_schedule", f"backfill_{GOLD}_schedule"):
        assert schedules[name]["cronSchedule"] == NEVER
        assert schedules[name]["executionTimezone"] == "UTC"
        assert schedules[name]["scheduleState"]["status"] == "RUNNING"
    sensors = {s["name"]: s["sensorState"]["status"] for s in repository["sensors"]}
    assert sensors["conflux_stream_health"] == "RUNNING"


def latest_run_of(ui: DagsterUI, asset: AssetKey, after: float) -> str | None:
    with ui.instance() as instance:
        for run in instance.get_runs(RunsFilter(created_after=datetime.fromtimestamp(after, UTC))):
            if run.asset_selection and asset in run.asset_selection:
                return run.run_id
    return None


def latest_metadata(ui: DagsterUI, key: AssetKey) -> dict[str, Any]:
    with ui.instance() as instance:
        event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None, key
    metadata = event.asset_materialization.metadata
    return {k: v.value if hasattr(v, "value") else v for k, v in metadata.items()}


def test_a_materialization_launched_over_graphql_writes_and_describes_every_table(
    dagster_ui: DagsterUI, sales: SalesFlow
) -> None:
    ui = dagster_ui
    run_id = ui.submit(f"run_{FLOW}")
    ui.wait_status(run_id, DagsterRunStatus.SUCCESS, 600)
    assert len(read_rows(sales.paths["bronze"], ["offset"])) == len(sales.sent)
    assert sales.gold(DATES) == sales.expected(DATES)

    events = latest_metadata(ui, AssetKey(["silver", f"silver_{FLOW}_events"]))
    schema = {c.name: c.type for c in events["dagster/column_schema"].columns}
    assert {"id": "long", "product": "string", "amount": "double"}.items() <= schema.items()
    assert events["dagster/row_count"] == len(sales.sent)
    parsed = events["dagster/column_lineage"].deps_by_column["amount"]
    assert [(d.asset_key.path[-1], d.column_name) for d in parsed] == [(f"bronze_{FLOW}", "value")]
    gold = latest_metadata(ui, AssetKey(["gold", GOLD]))
    assert gold["dagster/row_count"] == len(read_rows(sales.paths[f"gold/{GOLD}"], ["orders"]))
    revenue = gold["dagster/column_lineage"].deps_by_column["revenue"]
    assert [(d.asset_key.path[-1], d.column_name) for d in revenue] == [
        (f"silver_{FLOW}_events", "amount")
    ]
    history = [r.data for r in gold["history"].records]
    assert history[0]["version"] == gold["table_version"] and history[0]["operation"]
    with ui.instance() as instance:
        checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [AssetCheckKey(AssetKey(["gold", GOLD]), n) for n in GOLD_CHECKS]
        )
    assert {k.name: c.status.value for k, c in checks.items()} == dict.fromkeys(
        GOLD_CHECKS, "SUCCEEDED"
    )


def test_in_a_browser_materialize_the_flow_then_backfill_three_dates(
    dagster_ui: DagsterUI, sales: SalesFlow, kafka_broker: KafkaBroker
) -> None:
    ui, bronze = dagster_ui, AssetKey(["bronze", f"bronze_{FLOW}"])
    sales.send(kafka_broker.bootstrap_servers, sales.late)  # behind the first run's watermark
    with browser(ui.url, "materialize_and_backfill") as web:
        web.open("/asset-groups/ui_shop")
        web.screenshot("01_asset_graph")
        web.open(f"/assets/bronze/bronze_{FLOW}")
        clicked = datetime.now(UTC).timestamp()
        web.button("Materialize")
        web.button("Confirm")  # the flow is one multi-asset: its other tables come along
        run_id = wait_for(lambda: latest_run_of(ui, bronze, clicked), 60, "the run")
        web.leave()
        ui.wait_status(run_id, DagsterRunStatus.SUCCESS, 600)
        web.open(f"/runs/{run_id}")
        web.page.get_by_text("Success", exact=True).first.wait_for()
        web.screenshot("02_flow_run_succeeded")

        bronze_rows = read_rows(sales.paths["bronze"], ["offset"])
        assert len(bronze_rows) == len(sales.sent)
        late = read_rows(sales.paths[f"late/{GOLD}"], ["_event_time", "amount"])
        assert sorted((r["_event_time"].replace(tzinfo=UTC), r["amount"]) for r in late) == sorted(
            (e["ts"], e["amount"]) for e in sales.late
        )
        on_time_dates = [DATES[0], DATES[3]]
        assert sales.gold(on_time_dates) == sales.expected(on_time_dates)
        assert sales.gold(DATES[1:3]) != sales.expected(DATES[1:3])  # their late rows: not yet

        three = [d.isoformat() for d in DATES[1:]]
        web.open(f"/assets/backfill/{GOLD}")
        web.button(re.compile(r"^Materialize"))
        partitions = web.page.get_by_placeholder(re.compile("partition", re.IGNORECASE))
        partitions.fill(f"[{three[0]}...{three[-1]}]")
        partitions.press("Enter")
        web.screenshot("03_backfill_dialog")
        web.button("Launch backfill")
        launched = wait_for(
            lambda: next((b for b in ui.backfills() if sorted(b["partitionNames"]) == three), None),
            60,
            "the backfill launched from the dialog",
        )
        web.leave()
        done = ui.wait_backfill(launched["id"], 600)
        web.open(f"/runs/b/{launched['id']}?tab=runs")
        web.screenshot("04_backfill_succeeded")
    assert len(done["runs"]) == 1  # a date range is one run, one Spark job
    assert sales.gold(DATES) == sales.expected(DATES)  # the late rows of DATES[1:3] too
    record = latest_metadata(ui, AssetKey(["backfill", GOLD]))
    assert (record["first_date"], record["last_date"]) == (three[0], three[-1])
    assert record["late_rows_covered"] == sum(LATE_DATES.values())


def failed_run(ui: DagsterUI, backfill_id: str) -> str | None:
    """The run of a backfill that failed (None while none did)."""
    for backfill in ui.backfills():
        if backfill["id"] == backfill_id:
            failed = [r for r in backfill["runs"] if r["status"] == "FAILURE"]
            return failed[0]["runId"] if failed else None
    return None


def test_an_open_date_is_refused_and_the_scheduled_backfill_asks_for_closed_ones(
    dagster_ui: DagsterUI, sales: SalesFlow
) -> None:
    ui = dagster_ui
    # A date the stream can still change is refused, naming when it closes.
    open_day = (TODAY - timedelta(days=1)).isoformat()
    refused = ui.launch_partition_backfill(f"backfill/{GOLD}", [open_day])
    failed = wait_for(lambda: failed_run(ui, refused), 300, "the open date's backfill to fail")
    assert f"{open_day} is still open" in " ".join(ui.messages(failed))

    # The nightly backfill asks for the newest three dates the watermark closed.
    evaluation = ui.schedule_dry_run(f"backfill_{GOLD}_schedule")
    [request] = evaluation["runRequests"]
    tags = {t["key"]: t["value"] for t in request["tags"]}
    closed = TODAY - timedelta(days=2)  # the watermark is a day later, minus 10 minutes
    assert tags["dagster/asset_partition_range_end"] == closed.isoformat()
    assert tags["dagster/asset_partition_range_start"] == (closed - timedelta(days=2)).isoformat()

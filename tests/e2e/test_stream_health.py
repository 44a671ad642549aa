"""Stream health of continuous flows, as the UI shows it, on a real `dagster dev`.

Two continuous flows run at once, launched through GraphQL: ``ui_live`` reads a real topic,
``ui_stalled`` a broker address nothing listens on, so its query waits in its first trigger and
posts nothing. The ``conflux_stream_health`` sensor records the ``stream_health`` check of each:
``ui_live`` is healthy while idle with lag 0, ``ui_stalled`` is unhealthy once its heartbeat is
older than ``stale_after``. Then ``ui_live``'s Spark application is killed (SIGKILL on its
process group) while records keep arriving: the flow asset's retry policy starts it again from
its checkpoint, the run's event log shows the failed attempt and the restart, the run stays
STARTED, and the table holds every record exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetKey, DagsterEventType, DagsterRunStatus, EventRecordsFilter

from pipelines.catalog.state import FlowState
from pipelines.health import flow_health
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.e2e.bronze_check import assert_exactly_once, bronze_rows
from tests.support.browser import browser
from tests.support.dagster_ui import (
    DagsterUI,
    command_line,
    free_port,
    latest_term,
    processes_matching,
    wait_for,
)
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(1200)
LIVE, STALLED = "ui_live", "ui_stalled"
STALE_AFTER, SENSOR_SECONDS = 30, 15
#: A query stuck in its trigger does not stop by itself: escalate after 10 s, not 120.
QUICK_STOP = {"resources": {"spark_submit": {"config": {"graceful_stop_seconds": 10.0}}}}


def write_flow(flows: Path, name: str, max_restarts: int, **source: Any) -> Path:
    spec_file = flows / f"{name}.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "source": {
                    "kind": "kafka",
                    "topics": [LIVE],
                    "starting_offsets": "earliest",
                    **source,
                },
                "target": {"table": f"bronze_{name}"},
                "trigger": {
                    "mode": "continuous",
                    "interval": "1 second",
                    "stale_after": f"{STALE_AFTER} seconds",
                    "max_restarts": max_restarts,
                    "restart_delay": "2 seconds",
                },
            }
        )
    )
    return spec_file


def health_verdicts(ui: DagsterUI, flow: str) -> list[dict[str, Any]]:
    """The ``stream_health`` evaluations of ``flow``'s bronze asset, oldest first."""
    key = AssetKey(["bronze", f"bronze_{flow}"])
    with ui.instance() as instance:
        records = instance.get_event_records(
            EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), limit=1000
        )
    verdicts = []
    for record in sorted(records, key=lambda r: r.storage_id):
        event = record.event_log_entry.dagster_event
        evaluation = event.event_specific_data if event else None
        if (
            getattr(evaluation, "asset_key", None) == key
            and evaluation.check_name == "stream_health"
        ):
            metadata = {k: v.value for k, v in evaluation.metadata.items()}
            verdicts.append({"passed": evaluation.passed, **metadata})
    return verdicts


def newest_verdict(ui: DagsterUI, flow: str, **wanted: Any) -> dict[str, Any] | None:
    verdicts = health_verdicts(ui, flow)
    if verdicts and all(verdicts[-1].get(k) == v for k, v in wanted.items()):
        return verdicts[-1]
    return None


def kill_application(lease_dir: Location) -> str:
    """SIGKILL the flow's Spark application (its spark-submit JVM's process group)."""
    term = latest_term(lease_dir)
    assert term is not None and not term.released
    [jvm] = [p for p in processes_matching(term.owner) if "SparkSubmit" in command_line(p)]
    os.killpg(os.getpgid(jvm), signal.SIGKILL)
    return term.owner


def test_idle_is_healthy_stalled_is_unhealthy_and_a_killed_application_restarts(
    dagster_ui: DagsterUI, ui_flows: Path, kafka_broker: KafkaBroker, spark_settings: Settings
) -> None:
    ui, bootstrap = dagster_ui, kafka_broker.bootstrap_servers
    create_topic(bootstrap, LIVE, partitions=2)
    first = order_payloads(400)
    produce(bootstrap, LIVE, first)
    live_spec = write_flow(ui_flows, LIVE, max_restarts=2)
    write_flow(ui_flows, STALLED, max_restarts=0, bootstrap_servers=f"127.0.0.1:{free_port()}")
    ui.reload()
    live = FlowState.of(load_spec(live_spec), spark_settings)

    started = time.monotonic()
    live_run = ui.submit(f"run_{LIVE}")
    stalled_run = ui.submit(f"run_{STALLED}", QUICK_STOP)
    ui.wait_status(live_run, DagsterRunStatus.STARTED, 300)
    wait_for(lambda: bronze_rows(live.table) == len(first), 300, "the live flow to catch up")
    caught_up = time.monotonic()
    wait_for(lambda: newest_verdict(ui, LIVE, state="healthy", passed=True), 120, "healthy")
    # Idle for longer than stale_after plus a sensor interval: only idle heartbeats keep it
    # healthy (a stale verdict would have been recorded otherwise).
    time.sleep(max(0.0, STALE_AFTER + SENSOR_SECONDS - (time.monotonic() - caught_up)))
    idle = newest_verdict(ui, LIVE, state="healthy", passed=True)
    assert idle is not None and sum(idle["lag"].values()) == 0, health_verdicts(ui, LIVE)
    stalled = wait_for(
        lambda: newest_verdict(ui, STALLED, state="stale", passed=False), 240, "stalled = unhealthy"
    )
    assert "is its source reachable?" in stalled["reason"], stalled
    assert ui.status(stalled_run) == DagsterRunStatus.STARTED  # running, and known to be stuck
    with browser(ui.url, "stream_health") as web:
        web.open(f"/assets/bronze/bronze_{STALLED}?view=checks")
        web.page.get_by_text("stream_health").first.wait_for()
        web.screenshot("01_stalled_flow_unhealthy")
    ui.client.terminate_run(stalled_run)
    phases = {"unhealthy_seen": time.monotonic() - started}

    owner = kill_application(live.lease_dir)
    second = order_payloads(400, start=len(first))
    produce(bootstrap, LIVE, second)
    wait_for(
        lambda: (
            {DagsterEventType.STEP_UP_FOR_RETRY, DagsterEventType.STEP_RESTARTED}
            <= set(ui.event_types(live_run))
        ),
        180,
        "the flow's step to be retried",
    )
    wait_for(lambda: bronze_rows(live.table) == len(first) + len(second), 300, "the catch-up")
    assert_exactly_once(live.table, first + second)
    assert ui.status(live_run) == DagsterRunStatus.STARTED
    term = latest_term(live.lease_dir)
    assert term is not None and term.owner != owner and term.details["dagster_run_id"] == live_run
    assert any("exited with code" in m for m in ui.messages(live_run))
    phases["restarted_and_caught_up"] = time.monotonic() - started
    restarted = load_spec(live_spec)
    wait_for(lambda: (h := flow_health(restarted, spark_settings)) and h.healthy, 120, "healthy")
    wait_for(lambda: newest_verdict(ui, LIVE, state="healthy"), 120, "recorded healthy again")
    with browser(ui.url, "stream_health") as web:
        web.open(f"/runs/{live_run}")
        web.screenshot("02_killed_application_restarted")

    ui.client.terminate_run(live_run)
    ui.wait_status(live_run, DagsterRunStatus.CANCELED, 240)
    wait_for(
        lambda: ui.status(stalled_run) in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE),
        240,
        "the stalled run to end",
    )
    phases["all_stopped"] = time.monotonic() - started
    print(f"seconds since launch: {phases}")

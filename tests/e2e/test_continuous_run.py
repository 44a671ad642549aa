"""A continuous flow launched and stopped the way a person does it: through the web UI's GraphQL
API of a real `dagster dev`, with the run's progress visible while it runs."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, EventRecordsFilter
from dagster_graphql import DagsterGraphQLClient
from pyspark.sql import SparkSession

from pipelines.settings import PROJECT_ROOT, Settings
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(900)
RECORDS = 4000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dagster_ui(conflux_env: Path, tmp_path: Path) -> Iterator[tuple[DagsterGraphQLClient, Path]]:
    """`dagster dev` (web UI + daemon) on a free loopback port with its own instance folder."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "platform" / "dagster" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    log = (tmp_path / "dagster-dev.log").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=PROJECT_ROOT, env={**os.environ, "DAGSTER_HOME": str(home)},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, (
                "dagster dev did not start"
            )
            time.sleep(1)
        yield DagsterGraphQLClient("127.0.0.1", port_number=port), home
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def materialized_rows(instance: DagsterInstance, run_id: str) -> int:
    records = instance.get_event_records(
        EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION), limit=1000
    )
    return sum(
        int(r.asset_materialization.metadata["rows_written"].value)
        for r in records
        if r.run_id == run_id and r.asset_materialization is not None
    )


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def test_continuous_run_shows_progress_and_stops_gracefully_from_the_ui(
    dagster_ui: tuple[DagsterGraphQLClient, Path],
    kafka_broker: KafkaBroker,
    spark: SparkSession,
    spark_settings: Settings,
    conflux_env: Path,
) -> None:
    client, home = dagster_ui
    topic = "e2e_live"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
    (conflux_env / "e2e_live.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "e2e_live",
                "source": {"kind": "kafka", "topics": [topic]},
                "target": {"table": "bronze_e2e_live"},
                "trigger": {"mode": "continuous", "interval": "1 second"},
            }
        )
    )
    reload = client.reload_repository_location("conflux")  # the UI's "Reload definitions"
    assert reload.status.value == "SUCCESS", reload.message
    run_id = client.submit_job_execution(
        "run_e2e_live",
        run_config={"resources": {"spark_submit": {"config": {"progress_interval_seconds": 1.0}}}},
    )
    instance = DagsterInstance.from_config(str(home))

    wait_for(lambda: client.get_run_status(run_id) == DagsterRunStatus.STARTED, 120, "run start")
    produce(kafka_broker.bootstrap_servers, topic, order_payloads(RECORDS // 2))
    time.sleep(5)
    produce(kafka_broker.bootstrap_servers, topic, order_payloads(RECORDS // 2, start=RECORDS))
    wait_for(lambda: materialized_rows(instance, run_id) == RECORDS, 300, "progress events")
    assert client.get_run_status(run_id) == DagsterRunStatus.STARTED  # still running

    client.terminate_run(run_id)
    wait_for(
        lambda: client.get_run_status(run_id) == DagsterRunStatus.CANCELED, 240, "cancellation"
    )
    logs = [r.user_message for r in instance.all_logs(run_id) if r.user_message]
    assert any("stopping gracefully" in m for m in logs), logs[-20:]
    stray = subprocess.run(["pgrep", "-f", "e2e_live.yaml"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", "the Spark application must have exited"

    table = spark_settings.lake_dir / "bronze" / "bronze_e2e_live"
    bronze = spark.read.format("delta").load(str(table))
    assert bronze.count() == RECORDS
    assert bronze.select("partition", "offset").distinct().count() == RECORDS

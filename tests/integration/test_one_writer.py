"""One writer per flow, through the launchers people use: `conflux run` in a terminal and a Dagster
materialization. While one run holds the flow, a second launch fails at once with the lease error
and starts no Spark; Ctrl-C in the middle of a batch stops after that batch commits and exits 0;
`conflux stop` stops a run through the flow's stop channel; the table is exact (read with
delta-rs, independently of Spark)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.run_state import Phase, RunState, flow_run_state
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.support.dagster_ui import spark_application_pgid
from tests.support.delta_read import delta_table
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runner import CONFLUX, CliProcess
from tests.support.runtime import KafkaBroker, settings_env

pytestmark = pytest.mark.timeout(900)
RECORDS = 6_000  # two halves of five 600-record batches: before the Ctrl-C, and for it and after


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def batch_in_flight(checkpoint: Location) -> int | None:
    """A batch whose offsets are logged and whose commit is not: it is running now."""
    offsets = {int(name) for name in (checkpoint / "offsets").names() if name.isdigit()}
    commits = {int(name) for name in (checkpoint / "commits").names() if name.isdigit()}
    running = offsets - commits
    return max(running) if running else None


def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CONFLUX, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def kill_application(locations: FlowState) -> str:
    """SIGKILL the running application's process group (its spark-submit JVM and Python driver,
    in a session of their own); returns its lease owner."""
    term = locations.lease_store().latest()
    assert term is not None and term.live(), term
    pgid = spark_application_pgid(term.owner)
    assert pgid is not None, f"no Spark application of {term.owner}"
    os.killpg(pgid, signal.SIGKILL)
    return term.owner


def wait_for_state(spec: FlowSpec, settings: Settings, phase: Phase, timeout: float) -> RunState:
    """The flow's state once it is ``phase`` (polled every 50 ms: a restart's wait is seconds)."""
    deadline = time.monotonic() + timeout
    while (state := flow_run_state(spec, settings)).phase is not phase:
        assert time.monotonic() < deadline, f"not {phase.value} after {timeout:.0f} s: {state}"
        time.sleep(0.05)
    return state


@pytest.fixture
def flow(spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path) -> Iterator[tuple]:
    topic = "one_writer_orders"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=3)
    flows = tmp_path / "flows"
    flows.mkdir()
    spec_file = flows / "one_writer.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "one_writer",
                "source": {"kind": "kafka", "topics": [topic], "max_offsets_per_trigger": 600},
                "target": {"table": "bronze_one_writer"},
                "trigger": {
                    "mode": "continuous",
                    "interval": "1 second",
                    "restart_delay": "3 seconds",
                },
            }
        )
    )
    env = {**settings_env(spark_settings), "CONFLUX_FLOWS_DIR": str(flows)}
    yield topic, spec_file, env


def test_second_launch_refused_ctrl_c_mid_batch_and_stop_channel(
    flow: tuple, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, spec_file, env = flow
    locations = FlowState.of(load_spec(spec_file), spark_settings)
    records = order_payloads(RECORDS)
    produce(kafka_broker.bootstrap_servers, topic, records[: RECORDS // 2])

    first = CliProcess(env, tmp_path / "first.log", "run", "one_writer", "--continuous")
    wait_for(lambda: "conflux.progress " in first.output(), 300, "the first run's first batch")

    # A second launch from another terminal: refused before any Spark starts.
    started = time.monotonic()
    second = run_cli(env, "run", "one_writer", "--once")
    assert second.returncode == 3, second.stdout + second.stderr
    assert "flow one_writer is already running: its lease is held by owner cli-" in second.stderr
    assert "started flows" not in second.stdout + second.stderr
    assert time.monotonic() - started < 20, "the refusal must come before Spark starts"

    # ... and from Dagster: the materialization fails with the same lease error.
    from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            if key.startswith("CONFLUX_"):
                patch.setenv(key, value)
        from assets.definitions import build_definitions

        defs = build_definitions()
        with DagsterInstance.ephemeral() as instance:
            result = materialize(
                assets=list(defs.assets or []),
                selection=[AssetKey(["bronze", "bronze_one_writer"])],
                resources=defs.resources,
                instance=instance,
                raise_on_error=False,
            )
            assert not result.success
            [failure] = [
                e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE
            ]
            message = failure.step_failure_data.error.message
            assert "flow one_writer is already running: its lease is held by owner cli-" in message
            logs = [r.user_message for r in instance.all_logs(result.run_id) if r.user_message]
            assert not any(m.startswith("launching") for m in logs), "no spark-submit may start"

    status = run_cli(env, "status", "one_writer")
    assert status.returncode == 0 and "running (cli-" in status.stdout, status.stdout
    assert "last batch" in status.stdout and "lag one_writer_orders-0" in status.stdout

    # Ctrl-C while a batch is running: that batch commits, then the run exits 0.
    produce(kafka_broker.bootstrap_servers, topic, records[RECORDS // 2 :])
    inflight: list[int] = []
    wait_for(
        lambda: (b := batch_in_flight(locations.checkpoint)) is not None and not inflight.append(b),
        300,
        "a batch in flight",
    )
    first.interrupt()  # a terminal's Ctrl-C
    assert first.wait(timeout=240) == 0, first.output()[-4000:]
    output = first.output()
    assert "SIGINT: stopping after the in-flight batch commits" in output
    assert "stopping gracefully" in output
    assert (locations.checkpoint / "commits" / str(inflight[0])).exists(), "in-flight batch lost"
    lease = locations.lease_store().latest()
    assert lease is not None and lease.released, "the launcher releases the lease at exit"

    # A new continuous run; its Spark application is killed (kill -9 of its process group) after
    # its first batch: `conflux run` starts it again by itself, from the checkpoint. It catches up
    # and is stopped through the stop channel.
    again = CliProcess(env, tmp_path / "again.log", "run", "one_writer", "--continuous")
    spec = load_spec(spec_file)
    wait_for(lambda: "conflux.progress " in again.output(), 300, "the new run's first batch")
    killed = kill_application(locations)
    restarting = wait_for_state(spec, spark_settings, Phase.RESTARTING, 60)
    assert "attempt 1 of 5" in restarting.summary, restarting.summary
    assert "killed by SIGKILL (exit code 137) without recording why" in restarting.summary
    running = wait_for_state(spec, spark_settings, Phase.RUNNING, 120)
    assert running.owner != killed
    table = locations.table
    wait_for(
        lambda: delta_table(table).to_pyarrow_table(columns=["offset"]).num_rows >= RECORDS,
        300,
        "catching up",
    )
    stop = run_cli(env, "stop", "one_writer", timeout=240)
    assert stop.returncode == 0 and "flow one_writer stopped" in stop.stdout, stop.stdout
    assert again.wait(timeout=120) == 0, again.output()[-4000:]
    assert "restart 1 of 5 in 3 s" in again.output()
    status = run_cli(env, "status", "one_writer")
    assert "stopped on request by conflux stop (user " in status.stdout, status.stdout

    rows = delta_table(table).to_pyarrow_table(columns=["key", "value", "partition", "offset"])
    assert rows.num_rows == RECORDS
    coordinates = set(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True))
    assert len(coordinates) == RECORDS
    landed = Counter(zip(rows["key"].to_pylist(), rows["value"].to_pylist(), strict=True))
    assert landed == Counter(records)

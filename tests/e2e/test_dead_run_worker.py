"""A continuous run's Dagster run worker is SIGKILLed (an OOM kill, a lost container): nothing
reports the run's end, so the `conflux_dead_run_workers` sensor fails it once the flow's lease
lapses; the orphaned Spark application notices the unrenewed lease and stops itself; the next
launch takes the flow over, and every record lands exactly once."""

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus

from pipelines.catalog.state import FlowState
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.e2e.bronze_check import assert_exactly_once, bronze_rows
from tests.e2e.conftest import LEASE_SECONDS, write_continuous_flow
from tests.support.dagster_ui import (
    DagsterUI,
    command_line,
    descendants,
    latest_term,
    log_batches,
    processes_matching,
    wait_for,
)
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(1500)
FIRST, MORE = 2000, 300  # 100 a batch: ~20 batches for the first run; the takeover lands 300 more
RUN_CONFIG = {"resources": {"spark_submit": {"config": {"progress_interval_seconds": 1.0}}}}


def test_sigkilled_run_worker_fails_the_run_and_its_orphan_stops_by_itself(
    dagster_ui: DagsterUI, ui_flows: Path, kafka_broker: KafkaBroker, spark_settings: Settings
) -> None:
    ui, name, bootstrap = dagster_ui, "e2e_orphan", kafka_broker.bootstrap_servers
    records = order_payloads(FIRST)
    create_topic(bootstrap, name, partitions=2)
    produce(bootstrap, name, records)
    spec_file = write_continuous_flow(ui_flows, name, name, max_offsets_per_trigger=100)
    ui.reload()
    locations = FlowState.of(load_spec(spec_file), spark_settings)
    checkpoint, lease_dir, table = locations.checkpoint, locations.lease_dir, locations.table

    first = ui.submit(f"run_{name}", RUN_CONFIG)
    ui.wait_status(first, DagsterRunStatus.STARTED, 300)
    term = wait_for(
        lambda: (t := latest_term(lease_dir)) and t.details.get("dagster_run_id") == first and t,
        300,
        "the first run's lease",
    )
    wait_for(lambda: log_batches(checkpoint / "commits"), 300, "a committed batch")
    application = processes_matching(term.owner)
    assert application, f"no process of lease owner {term.owner}"

    # The run worker (the pid of the run's RUN_START event) dies with everything below it (the
    # step process that renews the lease, details.pid), except the Spark application, which runs
    # in a session of its own: a worker lost to an OOM kill or a dead container.
    with ui.instance() as instance:
        [worker] = [
            r.dagster_event.pid
            for r in instance.all_logs(first)
            if r.dagster_event and r.dagster_event.event_type == DagsterEventType.RUN_START
        ]
    doomed = [worker, *(p for p in descendants(worker) if p not in application)]
    assert int(term.details["pid"]) in doomed, (term.details, doomed)
    described = {pid: command_line(pid)[:120] for pid in doomed}
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    # (a) The run fails: Dagster's code server sees its run worker die by SIGKILL and says so at
    # once; were the code server gone too, the conflux_dead_run_workers sensor would, once the
    # lease lapsed. Either way within a lease period plus the sensor's interval.
    ui.wait_status(first, DagsterRunStatus.FAILURE, LEASE_SECONDS + 30)
    failed_after = time.monotonic() - killed_at
    messages = ui.messages(first)
    causes = (
        f"Run execution process for {first} was terminated by signal 9 (SIGKILL)",
        f"the run worker of flow {name} is gone",
    )
    told = [c for c in causes if any(c in m for m in messages)]
    assert told, messages[-10:]

    # (b) The orphaned application stops by itself when the lease is not renewed.
    wait_for(lambda: not processes_matching(term.owner), LEASE_SECONDS + 45, "the orphan to exit")
    orphan_exited_after = time.monotonic() - killed_at
    said = f"the lease of {term.owner} expires at"
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in ui.home.rglob("*")
        if p.is_file() and p.suffix in (".err", ".out", ".log")
    )
    assert said in logs and "was not renewed (is its launcher gone?)" in logs, (
        "the orphan must say why it stopped"
    )

    # (c) A new launch takes the flow over and writes new records.
    more = order_payloads(MORE, start=FIRST)
    produce(bootstrap, name, more)
    second = ui.submit(f"run_{name}", RUN_CONFIG)
    ui.wait_status(second, DagsterRunStatus.STARTED, 300)
    taken = wait_for(
        lambda: (t := latest_term(lease_dir)) and t.details.get("dagster_run_id") == second and t,
        120,
        "the second run's lease",
    )
    wait_for(lambda: bronze_rows(table) == FIRST + MORE, 300, "the new run to catch up", every=2)
    ui.client.terminate_run(second)
    ui.wait_status(second, DagsterRunStatus.CANCELED, 240)
    wait_for(lambda: not processes_matching(taken.owner), 30, "the second application to exit")

    # (d) Every record exactly once, whatever the orphan left uncommitted.
    assert_exactly_once(table, records + more)
    print(
        f"killed {described}; run FAILURE ({told}) after {failed_after:.1f} s, orphan gone after "
        f"{orphan_exited_after:.1f} s (lease {LEASE_SECONDS:.0f} s)"
    )

"""A continuous flow launched and stopped the way a person does it: through the web UI's GraphQL
API of a real `dagster dev`, with the run's progress visible while it runs.

The terminate lands in the middle of a running micro-batch, with records still waiting in Kafka:
that batch commits before the application exits and the run ends CANCELED. Meanwhile a second run
of the same job waits QUEUED in the flow's pool, with no process of its own, until the first run
has ended; then it starts, catches up, and the table holds every record exactly once.
"""

import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus

from pipelines.catalog.state import FlowState
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.e2e.bronze_check import assert_exactly_once, bronze_rows
from tests.e2e.conftest import write_continuous_flow
from tests.support.dagster_ui import (
    DagsterUI,
    batch_end_offsets,
    command_line,
    latest_term,
    log_batches,
    processes_matching,
    wait_for,
)
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(1500)
RECORDS = 3000
BATCH = 150  # maxOffsetsPerTrigger, a total over the partitions: about 20 micro-batches
RUN_CONFIG = {"resources": {"spark_submit": {"config": {"progress_interval_seconds": 1.0}}}}
#: Events of a run that got past the queue (a queued run shows none of them).
STARTED_EVENTS = {
    DagsterEventType.RUN_DEQUEUED,
    DagsterEventType.RUN_STARTING,
    DagsterEventType.RUN_START,
    DagsterEventType.ENGINE_EVENT,
    DagsterEventType.STEP_START,
}


def stop_file_of(owner: str) -> Path:
    """The runner's ``--stop-file``, read from its application's command line."""
    for pid in processes_matching(owner):
        args = command_line(pid).split()
        if "--stop-file" in args:
            return Path(args[args.index("--stop-file") + 1])
    raise AssertionError(f"no process of lease owner {owner} shows --stop-file")


def test_terminate_from_the_ui_commits_the_batch_in_flight_and_queues_a_second_run(
    dagster_ui: DagsterUI, ui_flows: Path, kafka_broker: KafkaBroker, spark_settings: Settings
) -> None:
    ui, name, bootstrap = dagster_ui, "e2e_live", kafka_broker.bootstrap_servers
    records = order_payloads(RECORDS)
    create_topic(bootstrap, name, partitions=2)
    produce(bootstrap, name, records)  # a backlog: each micro-batch takes 2 x BATCH of it
    spec_file = write_continuous_flow(ui_flows, name, name, max_offsets_per_trigger=BATCH)
    ui.reload()
    locations = FlowState.of(load_spec(spec_file), spark_settings)
    checkpoint, lease_dir, table = locations.checkpoint, locations.lease_dir, locations.table

    first = ui.submit(f"run_{name}", RUN_CONFIG)
    ui.wait_status(first, DagsterRunStatus.STARTED, 300)
    second = ui.submit(f"run_{name}", RUN_CONFIG)  # the same flow again, while the first runs

    def second_is_only_queued() -> None:
        assert ui.status(second) == DagsterRunStatus.QUEUED
        assert not set(ui.event_types(second)) & STARTED_EVENTS, ui.event_types(second)
        assert not processes_matching(second), "a queued run must not start any process"
        term = latest_term(lease_dir)
        assert term is None or term.details.get("dagster_run_id") == first, term

    term = wait_for(
        lambda: (t := latest_term(lease_dir)) and t.details.get("dagster_run_id") == first and t,
        300,
        "the first run's lease",
    )
    owner = term.owner
    wait_for(lambda: len(log_batches(checkpoint / "commits")) >= 2, 300, "two committed batches")
    wait_for(lambda: ui.materialized_rows(first) > 0, 60, "progress events in the run")
    second_is_only_queued()
    stop_file = stop_file_of(owner)

    def batch_in_flight() -> int | None:
        """The batch whose offsets are logged but not committed, while records still wait."""
        offsets, commits = log_batches(checkpoint / "offsets"), log_batches(checkpoint / "commits")
        if not offsets or max(offsets) in commits:
            return None
        batch = max(offsets)
        planned = sum(batch_end_offsets(checkpoint, batch)[name].values())
        assert planned < RECORDS, f"batch {batch} already reads to the end: no backlog left"
        return batch

    aimed = wait_for(batch_in_flight, 120, "a micro-batch in flight", every=0.05)
    second_is_only_queued()
    ui.client.terminate_run(first)  # the UI's "Terminate" button
    terminated_at = time.monotonic()

    # The launcher turns the terminate into the stop file: what was in flight at that moment?
    wait_for(stop_file.exists, 120, "the stop file", every=0.05)
    stopped_at = time.monotonic()
    offsets_at_stop = log_batches(checkpoint / "offsets")
    commits_at_stop = log_batches(checkpoint / "commits")
    in_flight = max(offsets_at_stop)
    assert in_flight not in commits_at_stop, (
        f"the stop ({stopped_at - terminated_at:.1f} s after the terminate) fell between batches"
    )
    assert sum(batch_end_offsets(checkpoint, in_flight)[name].values()) < RECORDS

    ui.wait_status(first, DagsterRunStatus.CANCELED, 240)
    # Batch `in_flight` was running when the stop came and committed before the application exited.
    assert in_flight in log_batches(checkpoint / "commits")
    assert offsets_at_stop <= log_batches(checkpoint / "commits")
    wait_for(lambda: not processes_matching(owner), 30, "the Spark application to exit")
    logs = ui.messages(first)
    assert any("run terminated: stopping the streams" in m for m in logs), logs[-20:]
    assert any("stopping gracefully" in m for m in logs), logs[-20:]
    after_first = bronze_rows(table)
    assert after_first < RECORDS, "the first run was stopped with records still waiting"
    assert ui.materialized_rows(first) <= after_first  # progress never claims unwritten rows

    # The pool's slot is free: the queued run starts now, catches up from the checkpoint.
    ui.wait_status(second, DagsterRunStatus.STARTED, 300)
    wait_for(lambda: bronze_rows(table) == RECORDS, 300, "the second run to catch up", every=2)
    term = wait_for(
        lambda: (t := latest_term(lease_dir)) and t.details.get("dagster_run_id") == second and t,
        60,
        "the second run's lease",
    )
    ui.client.terminate_run(second)
    ui.wait_status(second, DagsterRunStatus.CANCELED, 240)
    wait_for(lambda: not processes_matching(term.owner), 30, "the second application to exit")

    assert_exactly_once(table, records)
    print(
        f"aimed at batch {aimed}; stop file {stopped_at - terminated_at:.1f} s after terminate, "
        f"batch {in_flight} in flight; materialized rows: first {ui.materialized_rows(first)}, "
        f"second {ui.materialized_rows(second)}"
    )

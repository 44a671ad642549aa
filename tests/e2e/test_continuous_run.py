"""A continuous flow through its whole life on a real `dagster dev`, launched, stopped and watched
the way a person does it: through the web UI's GraphQL API, with the run's progress visible while
it runs, beside a second flow that cannot reach its source.

Every Dagster run is a run worker plus a spark-submit application (~20 s of CPU before its first
batch), so ONE flow, ``e2e_live``, plays each part in turn on one checkpoint and one table: four
applications in three runs, plus ``ui_stalled``'s one (three modules, one per part, launched seven
applications in six runs). Its topic holds a backlog of 3000 records (two partitions), read 100
per micro-batch (a total over the partitions) by runs 1 and 2; 300 more arrive before run 3, 300
more while run 3 restarts.

1. **Terminate from the UI** (run 1): the terminate lands in the middle of a running micro-batch
   (the application is held paused with the batch in flight until the launcher has turned the
   terminate into its stop file), with records still waiting in Kafka: that batch commits before
   the application exits and the run ends CANCELED. Meanwhile run 2 of the same job waits QUEUED in
   the flow's pool, with no process of its own, until run 1 has ended; then it starts and goes on
   from the checkpoint.
2. **A SIGKILLed run worker** (run 2, once it has committed a batch of its own): its run worker
   dies with everything below it but the Spark application, which runs in a session of its own
   (an OOM kill, a lost container). Nothing reports the run's end, yet the run is failed at once
   (the code server saw its worker die; the ``conflux_dead_run_workers`` sensor would once the
   lease lapsed), and the orphaned application, still working through the backlog, notices the
   unrenewed lease and stops itself.
3. **A takeover, then a SIGKILLed application** (run 3): a new launch takes the flow over and
   every record is in the table exactly once, whatever the orphan left uncommitted. (The spec
   drops ``max_offsets_per_trigger`` before this launch: the takeover's catch-up is one batch; how
   many batches it takes proves nothing.) Then the Spark application is killed (SIGKILL on its
   process group) while records keep arriving: the flow asset's retry policy starts it again from
   its checkpoint, the run's event log shows the failed attempt and the restart, the run stays
   STARTED, and the table holds every record exactly once.
4. **Stream health**, as the ``conflux_stream_health`` sensor records the ``stream_health`` check:
   ``ui_stalled`` (launched with run 1) reads a broker address nothing listens on, so its query
   waits in its first trigger and posts nothing: unhealthy once its heartbeat is older than
   ``stale_after``, with the run still STARTED. The restarted ``e2e_live``, idle for longer than
   ``stale_after``, is judged healthy with lag 0 by a sensor evaluation made after that: only its
   idle heartbeats keep it healthy. Run 3 is then terminated with records trickling in (the stop
   that can lose a batch: one is in flight), and the table holds every record sent before the
   stop exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from tests.e2e.conftest import LEASE_SECONDS
from tests.support.browser import browser
from tests.support.chaos import ApplicationGroup
from tests.support.dagster_ui import (
    DagsterUI,
    batch_end_offsets,
    command_line,
    descendants,
    free_port,
    latest_term,
    log_batches,
    processes_matching,
    spark_application_pgid,
    wait_for,
)
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.timeout(2400)
LIVE, STALLED = "e2e_live", "ui_stalled"
#: The backlog of runs 1 and 2, then what arrives before the takeover and while it restarts.
RECORDS, MORE, LATE = 3000, 300, 300
#: maxOffsetsPerTrigger of runs 1 and 2, a total over the partitions: 30 micro-batches of backlog.
#: With a 1 s trigger a run commits at most one batch a second, so run 1 (stopped at its third or
#: so) and run 2's orphan (its lease lapses within LEASE_SECONDS of the kill) leave records waiting.
BATCH = 100
#: The least ``stale_after`` the spec allows (2 x interval + 10 s, at least 30 s); the sensor's
#: ``minimum_interval_seconds`` is 15.
STALE_AFTER, SENSOR_SECONDS = 30, 15
#: Polling period of the waits on files and processes (cheap reads; a wait costs up to one period).
POLL = 0.25
RUN_CONFIG = {"resources": {"spark_submit": {"config": {"progress_interval_seconds": 1.0}}}}
#: A query stuck in its trigger does not stop by itself: escalate after 10 s, not 120.
QUICK_STOP = {"resources": {"spark_submit": {"config": {"graceful_stop_seconds": 10.0}}}}
#: Events of a run that got past the queue (a queued run shows none of them).
STARTED_EVENTS = {
    DagsterEventType.RUN_DEQUEUED,
    DagsterEventType.RUN_STARTING,
    DagsterEventType.RUN_START,
    DagsterEventType.ENGINE_EVENT,
    DagsterEventType.STEP_START,
}
SENSOR_TICKS = """query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
  __typename ... on Sensor { sensorState { ticks(limit: 20) { timestamp status skipReason } } }
  ... on PythonError { message } } }"""


def spark_application(owner: str) -> ApplicationGroup:
    """The process group of lease owner ``owner``'s running Spark application."""
    pgid = spark_application_pgid(owner)
    assert pgid is not None, f"no Spark application of lease owner {owner}"
    return ApplicationGroup(pgid)


@contextmanager
def frozen_in_flight(
    application: ApplicationGroup, in_flight: Callable[[], int | None], tries: int = 20
) -> Iterator[int]:
    """Hold ``application`` paused (SIGSTOP) while ``in_flight`` names a batch it is running;
    yields that batch and resumes it on leaving, however the block ends. A batch that committed
    between the look and the pause is let go, and the next one aimed at."""
    for _ in range(tries):
        wait_for(in_flight, 120, "a micro-batch in flight", every=0.05)
        application.pause()
        try:
            batch = in_flight()
            if batch is not None:
                yield batch
                return
        finally:
            application.resume()
    raise AssertionError(f"no batch of the application still in flight once paused ({tries} tries)")


def write_flow(
    flows: Path, name: str, *, max_restarts: int, max_offsets_per_trigger: int | None, **source: Any
) -> Path:
    """A continuous Kafka flow on topic ``LIVE`` from the earliest offset; ``source`` overrides."""
    spec_file = flows / f"{name}.yaml"
    batch = (
        {}
        if max_offsets_per_trigger is None
        else {"max_offsets_per_trigger": max_offsets_per_trigger}
    )
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "source": {
                    "kind": "kafka",
                    "topics": [LIVE],
                    "starting_offsets": "earliest",
                    **batch,
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


def sensor_states(ui: DagsterUI, flow: str, since: float) -> list[str]:
    """``flow``'s state in each ``conflux_stream_health`` evaluation that began at ``since``
    (epoch seconds) or later and has finished, as the sensor's tick history in the UI shows it
    (its skip reason lists ``<flow>: <state>`` for each running flow); newest first. A tick still
    in progress (``STARTED``) has no skip reason yet: read as "absent", it failed a run of the
    suite whose poll landed during an evaluation, so it is left out until it finishes."""
    selector = {
        "repositoryLocationName": "conflux",
        "repositoryName": "__repository__",
        "sensorName": "conflux_stream_health",
    }
    found = ui.graphql(SENSOR_TICKS, {"selector": selector})["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    states = []
    for tick in found["sensorState"]["ticks"]:
        if tick["timestamp"] >= since and tick["status"] != "STARTED":
            verdicts = dict(
                part.split(": ", 1)
                for part in (tick["skipReason"] or "").split("; ")
                if ": " in part
            )
            states.append(verdicts.get(flow, "absent"))
    return states


def kill_application(lease_dir: Location) -> str:
    """SIGKILL the flow's Spark application (its spark-submit JVM's process group)."""
    term = latest_term(lease_dir)
    assert term is not None and not term.released
    os.killpg(spark_application(term.owner).pgid, signal.SIGKILL)
    return term.owner


def stop_file_of(owner: str) -> Path:
    """The runner's ``--stop-file``, read from its application's command line."""
    for pid in processes_matching(owner):
        args = command_line(pid).split()
        if "--stop-file" in args:
            return Path(args[args.index("--stop-file") + 1])
    raise AssertionError(f"no process of lease owner {owner} shows --stop-file")


@contextmanager
def trickle(bootstrap: str, topic: str, start: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """Send one record every 0.2 s to partition 0 of ``topic`` (from a thread) while the block
    runs; yields the records delivered so far, in order (the table holds a prefix of them).

    A query with data in every trigger is the one a stop can cut mid-batch: the runner must let
    the batch in flight commit (:func:`pipelines.stopping.stop_after_inflight_batches`).
    """
    sent: list[tuple[bytes, bytes]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def send() -> None:
        while not done.wait(0.2):
            record = order_payloads(1, start=start + len(sent))[0]
            try:
                produce(bootstrap, topic, [record], partition=0)
            except BaseException as exc:  # reported when the block ends
                errors.append(exc)
                return
            sent.append(record)

    thread = threading.Thread(target=send, name="trickle", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        done.set()
        thread.join(timeout=30)
    assert not errors, errors


def test_a_continuous_flow_terminated_queued_orphaned_taken_over_restarted_and_judged_healthy(
    dagster_ui: DagsterUI, ui_flows: Path, kafka_broker: KafkaBroker, spark_settings: Settings
) -> None:
    ui, name, bootstrap = dagster_ui, LIVE, kafka_broker.bootstrap_servers
    records = order_payloads(RECORDS)
    create_topic(bootstrap, name, partitions=2)
    produce(bootstrap, name, records)  # a backlog: each micro-batch takes BATCH of it
    spec_file = write_flow(ui_flows, name, max_restarts=2, max_offsets_per_trigger=BATCH)
    write_flow(
        ui_flows,
        STALLED,
        max_restarts=0,
        max_offsets_per_trigger=None,
        bootstrap_servers=f"127.0.0.1:{free_port()}",
    )
    ui.reload()
    locations = FlowState.of(load_spec(spec_file), spark_settings)
    checkpoint, lease_dir, table = locations.checkpoint, locations.lease_dir, locations.table
    started = time.monotonic()
    phases: dict[str, float] = {}

    def lease_of(run_id: str, timeout: float) -> Any:
        return wait_for(
            lambda: (
                (t := latest_term(lease_dir)) and t.details.get("dagster_run_id") == run_id and t
            ),
            timeout,
            f"the lease of run {run_id}",
            every=POLL,
        )

    # --- 1. Terminate from the UI, with a second run QUEUED ---------------------------------
    stalled_run = ui.submit(f"run_{STALLED}", QUICK_STOP)
    first = ui.submit(f"run_{name}", RUN_CONFIG)
    ui.wait_status(first, DagsterRunStatus.STARTED, 300)
    second = ui.submit(f"run_{name}", RUN_CONFIG)  # the same flow again, while the first runs

    def second_is_only_queued() -> None:
        assert ui.status(second) == DagsterRunStatus.QUEUED
        assert not set(ui.event_types(second)) & STARTED_EVENTS, ui.event_types(second)
        assert not processes_matching(second), "a queued run must not start any process"
        term = latest_term(lease_dir)
        assert term is None or term.details.get("dagster_run_id") == first, term

    owner = lease_of(first, 300).owner
    wait_for(
        lambda: len(log_batches(checkpoint / "commits")) >= 2,
        300,
        "two committed batches",
        every=POLL,
    )
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

    # The application is held paused (SIGSTOP) with a batch in flight until the stop file is
    # there, so the terminate lands in that batch whatever the machine's load: unpaused, a batch of
    # 100 records once committed between the look that saw it in flight and the stop file, which
    # came 0.1 s after the terminate (bench/HISTORY.md, "Suite, ninth session").
    with frozen_in_flight(spark_application(owner), batch_in_flight) as in_flight:
        second_is_only_queued()
        ui.client.terminate_run(first)  # the UI's "Terminate" button
        terminated_at = time.monotonic()
        # The launcher (in the step process, not paused) turns the terminate into the stop file.
        wait_for(stop_file.exists, 120, "the stop file", every=0.05)
        stopped_at = time.monotonic()
        offsets_at_stop = log_batches(checkpoint / "offsets")
        assert max(offsets_at_stop) == in_flight, (offsets_at_stop, in_flight)

    ui.wait_status(first, DagsterRunStatus.CANCELED, 240)
    # Batch `in_flight` was running when the stop came and committed before the application exited.
    commits_after_first = log_batches(checkpoint / "commits")
    assert in_flight in commits_after_first
    assert offsets_at_stop <= commits_after_first
    wait_for(lambda: not processes_matching(owner), 30, "the Spark application to exit", every=POLL)
    logs = ui.messages(first)
    assert any("run terminated: stopping the streams" in m for m in logs), logs[-20:]
    assert any("stopping gracefully" in m for m in logs), logs[-20:]
    after_first = bronze_rows(table)
    assert after_first < RECORDS, "the first run was stopped with records still waiting"
    assert ui.materialized_rows(first) <= after_first  # progress never claims unwritten rows
    phases["1_terminated"] = time.monotonic() - started

    # --- 2. The queued run starts; its run worker is SIGKILLed -------------------------------
    # The pool's slot is free: the queued run starts now and goes on from the checkpoint.
    ui.wait_status(second, DagsterRunStatus.STARTED, 300)
    term = lease_of(second, 300)
    wait_for(
        lambda: max(log_batches(checkpoint / "commits")) > max(commits_after_first),
        300,
        "a batch committed by the second run",
        every=0.2,
    )
    assert bronze_rows(table) > after_first
    application = processes_matching(term.owner)
    assert application, f"no process of lease owner {term.owner}"

    # The run worker (the pid of the run's RUN_START event) dies with everything below it (the
    # step process that renews the lease, details.pid), except the Spark application, which runs
    # in a session of its own: a worker lost to an OOM kill or a dead container.
    with ui.instance() as instance:
        [worker] = [
            r.dagster_event.pid
            for r in instance.all_logs(second)
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
    ui.wait_status(second, DagsterRunStatus.FAILURE, LEASE_SECONDS + 30)
    failed_after = time.monotonic() - killed_at
    messages = ui.messages(second)
    causes = (
        f"Run execution process for {second} was terminated by signal 9 (SIGKILL)",
        f"the run worker of flow {name} is gone",
    )
    told = [c for c in causes if any(c in m for m in messages)]
    assert told, messages[-10:]

    # (b) The orphaned application stops by itself at once: its launcher (details.pid) is gone,
    # so nothing renews the lease; it does not wait for the expiry.
    wait_for(lambda: not processes_matching(term.owner), 30, "the orphan to exit", every=POLL)
    orphan_exited_after = time.monotonic() - killed_at
    said = f"its launcher {term.owner} (pid {term.details['pid']} on"
    logs_text = "\n".join(
        p.read_text(errors="replace")
        for p in ui.home.rglob("*")
        if p.is_file() and p.suffix in (".err", ".out", ".log")
    )
    assert said in logs_text and "is gone: nothing renews the lease" in logs_text, (
        "the orphan must say why it stopped"
    )
    after_orphan = bronze_rows(table)
    assert after_orphan < RECORDS, "the orphan was busy: it stopped with records still waiting"
    phases["2_orphan_gone"] = time.monotonic() - started

    # --- 3. A new launch takes the flow over; then its application is SIGKILLed ------------
    write_flow(ui_flows, name, max_restarts=2, max_offsets_per_trigger=None)  # read at launch
    more = order_payloads(MORE, start=RECORDS)
    produce(bootstrap, name, more)
    third = ui.submit(f"run_{name}", RUN_CONFIG)

    # Meanwhile (the takeover's application starts): the stalled flow is judged unhealthy.
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

    ui.wait_status(third, DagsterRunStatus.STARTED, 300)
    lease_of(third, 120)
    wait_for(
        lambda: bronze_rows(table) == RECORDS + MORE, 300, "the takeover to catch up", every=POLL
    )
    # Every record exactly once, whatever the orphan left uncommitted.
    assert_exactly_once(table, records + more)
    phases["3_taken_over"] = time.monotonic() - started

    killed_owner = kill_application(lease_dir)
    late = order_payloads(LATE, start=RECORDS + MORE)
    produce(bootstrap, name, late)
    wait_for(
        lambda: (
            {DagsterEventType.STEP_UP_FOR_RETRY, DagsterEventType.STEP_RESTARTED}
            <= set(ui.event_types(third))
        ),
        180,
        "the flow's step to be retried",
    )
    everything = records + more + late
    wait_for(
        lambda: bronze_rows(table) == len(everything), 300, "the restarted catch-up", every=POLL
    )
    caught_up_at = time.time()
    assert_exactly_once(table, everything)
    assert ui.status(third) == DagsterRunStatus.STARTED
    restarted = latest_term(lease_dir)
    assert restarted is not None and restarted.owner != killed_owner
    assert restarted.details["dagster_run_id"] == third
    assert any("exited with code" in m for m in ui.messages(third))
    phases["3_restarted_and_caught_up"] = time.monotonic() - started
    with browser(ui.url, "stream_health") as web:  # while the flow idles
        web.open(f"/runs/{third}")
        web.screenshot("02_killed_application_restarted")
    phases["3_screenshot"] = time.monotonic() - started

    # --- 4. Idle for longer than stale_after, the restarted flow is judged healthy ---------
    # A sensor evaluation that began stale_after past the last commit: were it not for the idle
    # heartbeats, it would find the heartbeat older than stale_after (and record it stale).
    judged = wait_for(
        lambda: sensor_states(ui, name, since=caught_up_at + STALE_AFTER),
        STALE_AFTER + 4 * SENSOR_SECONDS + 60,
        f"a sensor evaluation {STALE_AFTER} s after the last commit",
    )
    assert set(judged) == {"healthy"}, judged
    idle = newest_verdict(ui, name, state="healthy", passed=True)
    assert idle is not None and sum(idle["lag"].values()) == 0, health_verdicts(ui, name)
    health = flow_health(load_spec(spec_file), spark_settings)
    assert health is not None and health.healthy and sum(health.lag.values()) == 0, health
    phases["4_idle_judged_healthy"] = time.monotonic() - started

    # The run is stopped with records flowing (see :func:`trickle`): its in-flight batch
    # commits, and every record sent before it is in the table once.
    with trickle(bootstrap, name, start=len(everything)) as sent:
        wait_for(
            lambda: bronze_rows(table) > len(everything), 120, "a batch of the trickle", every=POLL
        )
        ui.client.terminate_run(third)
        ui.wait_status(third, DagsterRunStatus.CANCELED, 240)
        phases["canceled"] = time.monotonic() - started
        wait_for(
            lambda: not processes_matching(restarted.owner), 30, "the last application", every=POLL
        )
    assert_exactly_once(table, everything + sent[: bronze_rows(table) - len(everything)])
    wait_for(
        lambda: ui.status(stalled_run) in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE),
        240,
        "the stalled run to end",
    )
    phases["all_stopped"] = time.monotonic() - started
    print(
        f"seconds since launch: {phases}; stop file {stopped_at - terminated_at:.1f} s after "
        f"terminate, batch {in_flight} in flight (held paused); rows "
        f"after run 1 {after_first}, after the orphan {after_orphan}; killed {described}; run 2 "
        f"FAILURE ({told}) after {failed_after:.1f} s, orphan gone after "
        f"{orphan_exited_after:.1f} s (lease {LEASE_SECONDS:.0f} s)"
    )

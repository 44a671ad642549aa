"""A real `dagster dev` (web UI + daemon) for end-to-end tests, driven through its GraphQL API the
way a person drives the UI, plus what those tests read beside it: runs' events, the Spark
checkpoint's offset and commit logs, a flow's lease and the Spark application's processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, EventRecordsFilter
from dagster_graphql import DagsterGraphQLClient

from pipelines.lease import LeaseTerm, StoredLeaseStore
from pipelines.location import Location
from pipelines.settings import PROJECT_ROOT

FINISHED = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)


@dataclass
class DagsterUI:
    """A running `dagster dev`: its GraphQL client, its instance folder and its log file."""

    client: DagsterGraphQLClient
    home: Path
    log: Path
    process: subprocess.Popen[bytes]

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.home))

    def reload(self) -> None:
        """The UI's "Reload definitions": picks up flow specs written since the last load."""
        result = self.client.reload_repository_location("conflux")
        assert result.status.value == "SUCCESS", getattr(result, "message", result)

    def submit(self, job: str, run_config: Mapping[str, Any] | None = None) -> str:
        return self.client.submit_job_execution(job, run_config=dict(run_config or {}))

    def status(self, run_id: str) -> DagsterRunStatus:
        return self.client.get_run_status(run_id)

    def wait_status(
        self, run_id: str, wanted: DagsterRunStatus | tuple[DagsterRunStatus, ...], timeout: float
    ) -> DagsterRunStatus:
        """Wait until the run is in ``wanted``; fail at once if it finished otherwise."""
        targets = wanted if isinstance(wanted, tuple) else (wanted,)

        def reached() -> DagsterRunStatus | None:
            status = self.status(run_id)
            if status in targets:
                return status
            assert status not in FINISHED, (
                f"run {run_id} ended {status.value} while waiting for "
                f"{[t.value for t in targets]}:\n" + "\n".join(self.messages(run_id)[-30:])
            )
            return None

        return wait_for(reached, timeout, f"run {run_id} to be {[t.value for t in targets]}")

    def messages(self, run_id: str) -> list[str]:
        """Every message of the run's event log, with the error text of events that carry one."""
        with self.instance() as instance:
            return [event_text(record) for record in instance.all_logs(run_id)]

    def event_types(self, run_id: str) -> list[DagsterEventType]:
        with self.instance() as instance:
            return [
                r.dagster_event.event_type for r in instance.all_logs(run_id) if r.dagster_event
            ]

    def materialized_rows(self, run_id: str) -> int:
        """Sum of ``rows_written`` over the run's materialization events (progress so far)."""
        with self.instance() as instance:
            records = instance.get_event_records(
                EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION), limit=10_000
            )
        return sum(
            int(r.asset_materialization.metadata["rows_written"].value)
            for r in records
            if r.run_id == run_id and r.asset_materialization is not None
        )

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def url(self) -> str:
        """The web UI's address (what a browser opens)."""
        return f"http://127.0.0.1:{self.client._port_number}"

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A GraphQL query or mutation, as the UI sends it."""
        return dict(self.client._execute(query, dict(variables or {})))

    def asset_nodes(self) -> dict[str, dict[str, Any]]:
        """Every asset node of the graph by its key (``a/b``): group, owners, tags, upstream
        keys, partitioning and checks."""
        nodes = self.graphql(ASSET_NODES)["assetNodes"]
        return {"/".join(n["assetKey"]["path"]): n for n in nodes}

    def repository(self) -> dict[str, Any]:
        """The code location's repository: its schedules and sensors."""
        [repository] = self.graphql(REPOSITORY)["repositoriesOrError"]["nodes"]
        return dict(repository)

    def schedule_dry_run(self, schedule: str) -> dict[str, Any]:
        """The UI's "Test schedule": evaluate it now, launching nothing."""
        result = self.graphql(
            SCHEDULE_DRY_RUN,
            {"selector": {**REPOSITORY_SELECTOR, "scheduleName": schedule}, "ts": time.time()},
        )["scheduleDryRun"]
        assert result["__typename"] == "DryRunInstigationTick", result
        return dict(result["evaluationResult"])

    def launch_partition_backfill(self, asset_key: str, partitions: list[str]) -> str:
        """The UI's backfill dialog: ``partitions`` of one asset; returns the backfill id."""
        result = self.graphql(
            LAUNCH_BACKFILL,
            {
                "params": {
                    "assetSelection": [{"path": asset_key.split("/")}],
                    "partitionNames": partitions,
                }
            },
        )["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return str(result["backfillId"])

    def backfills(self) -> list[dict[str, Any]]:
        """Recent partition backfills, newest first: id, status, partitions, runs."""
        result = self.graphql(BACKFILLS)["partitionBackfillsOrError"]
        return list(result["results"])

    def wait_backfill(self, backfill_id: str, timeout: float) -> dict[str, Any]:
        """Wait for the backfill to finish; fail unless it succeeded."""

        def finished() -> dict[str, Any] | None:
            found = [b for b in self.backfills() if b["id"] == backfill_id]
            if found and found[0]["status"] in BACKFILL_DONE:
                return found[0]
            return None

        done = wait_for(finished, timeout, f"backfill {backfill_id}", every=2)
        assert done["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), done
        return dict(done)


REPOSITORY_SELECTOR = {"repositoryLocationName": "conflux", "repositoryName": "__repository__"}
BACKFILL_DONE = ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")
ASSET_NODES = """{ assetNodes { assetKey { path } groupName description isPartitioned
  owners { __typename ... on UserAssetOwner { email } ... on TeamAssetOwner { team } }
  tags { key value } dependencyKeys { path }
  assetChecksOrError { ... on AssetChecks { checks { name } } } } }"""
REPOSITORY = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name
  schedules { name cronSchedule executionTimezone scheduleState { status } }
  sensors { name sensorState { status } } } } } }"""
SCHEDULE_DRY_RUN = """mutation($selector: ScheduleSelector!, $ts: Float) {
  scheduleDryRun(selectorData: $selector, timestamp: $ts) { __typename
    ... on DryRunInstigationTick { evaluationResult {
      runRequests { runKey tags { key value } } skipReason error { message } } }
    ... on PythonError { message } } }"""
LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) { __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack } ... on UnauthorizedError { message } } }"""
BACKFILLS = """{ partitionBackfillsOrError(limit: 20) { ... on PartitionBackfills { results {
  id status partitionNames runs(limit: 10) { runId status } } } } }"""


def event_text(record: Any) -> str:
    """An event log record as text: its message, plus the error (and causes) it carries."""
    parts = [record.user_message or ""]
    event = record.dagster_event
    if event is not None:
        parts.append(event.message or "")
        error = getattr(event.event_specific_data, "error", None)
        while error is not None:
            parts.append(error.message)
            error = error.cause
    return " | ".join(p for p in parts if p)


#: Added to the project's dagster.yaml for the tests' `dagster dev`: the queued-run coordinator
#: looks for runs to start every second instead of every 5 (a submitted run waited 2.5 s on
#: average; the flow pools still hold a second run of a flow QUEUED), and the asset daemon keeps
#: its 30 s, which :data:`DAEMON_PACE` would otherwise shorten.
TEST_INSTANCE = """
# tests/support/dagster_ui.py: the suite's pace
run_queue:
  dequeue_interval_seconds: 1
auto_materialize:
  minimum_interval_seconds: 30
"""
#: A ``sitecustomize`` that sets the daemon's backfill loop to iterate every
#: ``$DAGSTER_TEST_BACKFILL_INTERVAL_SECONDS`` instead of Dagster's fixed 30 s (see its doc).
DAEMON_PACE = Path(__file__).resolve().parent / "daemon_pace"
DAEMON_PACE_VARIABLE = "DAGSTER_TEST_BACKFILL_INTERVAL_SECONDS"


@contextmanager
def dagster_dev(env: Mapping[str, str], home: Path, timeout: float = 300) -> Iterator[DagsterUI]:
    """Start `dagster dev` for the project's workspace with ``env``; stop its process group after.

    ``home`` becomes DAGSTER_HOME with the project's dagster.yaml (the queued run coordinator, the
    flow pools), so the daemon runs sensors and dequeues runs as in production, at a quicker pace
    (:data:`TEST_INSTANCE`, :data:`DAEMON_PACE`): the same steps, less idling between them.
    """
    home.mkdir(parents=True, exist_ok=True)
    project = (PROJECT_ROOT / "platform" / "dagster" / "dagster.yaml").read_text()
    (home / "dagster.yaml").write_text(project + TEST_INSTANCE)
    port = free_port()
    log = home / "dagster-dev.log"
    paths = [str(DAEMON_PACE), *filter(None, [env.get("PYTHONPATH")])]
    paced = {"PYTHONPATH": os.pathsep.join(paths), DAEMON_PACE_VARIABLE: "2"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml",
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=PROJECT_ROOT, env={**env, **paced, "DAGSTER_HOME": str(home)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ui = DagsterUI(DagsterGraphQLClient("127.0.0.1", port_number=port), home, log, process)
    try:

        def serving() -> bool:
            assert process.poll() is None, f"dagster dev exited:\n{ui.log_text()[-3000:]}"
            try:
                return requests.get(f"http://127.0.0.1:{port}/server_info", timeout=2).ok
            except requests.RequestException:
                return False

        wait_for(serving, timeout, "dagster dev to serve")
        yield ui
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            # A run worker still stopping its flow can hold `dagster dev` up to a minute; at the
            # package's end nothing needs it: a Spark application it leaves sees its launcher
            # gone and stops within a second (pipelines/lease.py).
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


# --- the Spark side: checkpoint logs, the lease, the application's processes -----------------


def log_batches(folder: Location) -> set[int]:
    """Batch ids present in a Structured Streaming log folder (``offsets/`` or ``commits/``)."""
    return {int(name) for name in folder.names() if name.isdigit()}


def batch_end_offsets(checkpoint: Location, batch: int) -> dict[str, dict[str, int]]:
    """The Kafka end offsets planned for ``batch`` (last line of ``offsets/<batch>``)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().strip().splitlines()
    return dict(json.loads(lines[-1]))


def latest_term(lease_dir: Location) -> LeaseTerm | None:
    """The newest term of the lease kept in ``lease_dir`` (:attr:`FlowState.lease_dir`)."""
    return StoredLeaseStore(lease_dir.uri, lease_dir.storage).latest()


def processes_matching(pattern: str) -> list[int]:
    """Pids whose command line contains ``pattern`` (``pgrep -f``), this process excluded."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(p) for p in found.stdout.split() if int(p) != os.getpid()]


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (field 4 of ``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def spark_application_pgid(owner: str) -> int | None:
    """The process group of lease owner ``owner``'s running Spark application, None if it has
    none: its spark-submit JVM leads the group (the launcher starts it in a session of its own),
    the Python driver below it."""
    jvms = [p for p in processes_matching(owner) if "SparkSubmit" in command_line(p)]
    # A process the JVM is forking (Hadoop runs shell commands) shows the JVM's command line
    # until it execs: the application is the match whose parent is not a match too.
    leaders = [p for p in jvms if (parent := _parent_or_none(p)) and parent not in jvms]
    assert len(leaders) <= 1, f"more than one Spark application of {owner}: {leaders}"
    return os.getpgid(leaders[0]) if leaders else None


def _parent_or_none(pid: int) -> int | None:
    try:
        return parent_pid(pid)
    except FileNotFoundError:  # it exited meanwhile: not the application
        return None


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(parent_pid(int(entry)), []).append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found

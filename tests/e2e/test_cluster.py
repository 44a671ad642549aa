"""The cluster profile end to end: flows launched from Dagster (its runs in PostgreSQL) run on the
project's Spark standalone cluster, whose workers cannot see the driver's runtime folder, with
every table, checkpoint and lease on the S3 store.

One cluster (a master, two workers), one PostgreSQL and one S3 store for the module, started by
their ``platform/`` managers as a user starts them; Dagster runs as the ``dagster`` command (a
process of its own: a Spark driver in this test process would pin the worker's session to the
cluster). Data are small: what is proven is where the work runs and that it is exact there.
Needs root (the workers' mount namespaces, PostgreSQL run as its own user), as CI has.

1. :func:`test_flows_from_dagster_run_on_the_cluster_and_equal_the_model`: a gold flow launched
   by ``ingest_incremental``; read with delta-rs from the store, gold equals the model, and an
   executor on each worker ran tasks; then the spec's backfill schedule, ticked by
   ``dagster-daemon`` on PostgreSQL, launches a run over the closed day that rewrites it, equal
   to the model (tick and run recorded there). Late rows and their reconciliation are
   :mod:`tests.integration.test_gold`'s (on the S3 store too): on the cluster they would take a
   second run of the flow.
2. :func:`test_a_flow_with_a_local_table_is_refused_before_spark_starts`: by the launcher, before
   its lease is taken or an application registers with the master.
3. :func:`test_workers_cannot_see_the_drivers_runtime_folder`.
4. :func:`test_executor_worker_and_driver_killed_mid_batch_lose_nothing`: a continuous CDC flow
   under Dagster loses an executor (``make chaos``: then a Worker daemon and its driver too), each
   by SIGKILL in a silver batch caught mid-way, and carries on by itself; every table equals the
   model. Its stream's keys: ``CLUSTER_FAULT_KEYS`` (60; ``make chaos``: 2,000). Last: under
   ``make chaos`` it leaves one worker dead.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType, TickStatus

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.settings import PROJECT_ROOT, Settings, load_settings
from pipelines.spec import load_spec
from tests.conftest import TEST_DRIVER_CONF, TEST_DRIVER_JVM_OPTIONS
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_gold import AGGREGATES, ORDER_SCHEMA, TEN, order, send
from tests.integration.test_silver import (
    CdcStream,
    SilverPaths,
    check_current_state,
    check_events,
    check_silver_tables,
    silver_flow,
)
from tests.support.cdc import produce_cdc
from tests.support.chaos import FULL_SCHEDULE, MID_BATCH, Aim, ApplicationGroup, kill_mid_batch
from tests.support.dagster_ui import (
    command_line,
    latest_term,
    parent_pid,
    processes_matching,
    spark_application_pgid,
    wait_for,
)
from tests.support.delta_read import delta_table
from tests.support.gold import expected_gold, read_gold
from tests.support.kafka import create_topic
from tests.support.runtime import KafkaBroker, S3Store, ServiceCli
from tests.support.tables import gold_path

pytestmark = pytest.mark.timeout(1800)
BIN = Path(sys.executable).parent
CLUSTER_SCRIPT = PROJECT_ROOT / "platform" / "spark" / "cluster.py"
POSTGRES_SCRIPT = PROJECT_ROOT / "platform" / "postgres" / "server.py"
#: Keys of the fault test's CDC stream (``make chaos``: more).
FAULT_KEYS = int(os.environ.get("CLUSTER_FAULT_KEYS", "60"))
DAY = date(2026, 11, 20)


@dataclass(frozen=True)
class Cluster:
    runtime: Path
    state: dict[str, Any]


@pytest.fixture(scope="module")
def postgres(kafka_jars_dir: Path) -> Iterator[Path]:
    """ONE PostgreSQL for the module; yields its runtime folder (holding the Dagster instance).
    Outside pytest's temporary folders, which are private to root: PostgreSQL runs as Debian's
    ``postgres`` user and must reach its data folder."""
    runtime = Path(tempfile.mkdtemp(prefix="conflux-pg-"))
    os.chmod(runtime, 0o711)
    cli = ServiceCli(kafka_jars_dir, POSTGRES_SCRIPT)
    try:
        started = cli.run("start", runtime_dir=runtime)
        if started.returncode != 0:
            pytest.fail(f"PostgreSQL did not start:\n{cli.describe(started)}")
        yield runtime
    finally:
        stopped = cli.run("stop", runtime_dir=runtime)
        shutil.rmtree(runtime, ignore_errors=True)
        assert stopped.returncode == 0, cli.describe(stopped)


@pytest.fixture(scope="module")
def spark_cluster(
    kafka_jars_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """ONE standalone cluster for the module, its workers in private mount namespaces."""
    runtime = tmp_path_factory.mktemp("cluster-runtime")
    cli = ServiceCli(kafka_jars_dir, CLUSTER_SCRIPT)
    try:
        started = cli.run("start", "--isolation", "namespace", runtime_dir=runtime)
        if started.returncode != 0:
            pytest.fail(f"the Spark cluster did not start:\n{cli.describe(started)}")
        yield Cluster(runtime, cli.parse(started))
    finally:
        stopped = cli.run("stop", runtime_dir=runtime)
        assert stopped.returncode == 0, cli.describe(stopped)


@pytest.fixture(scope="module")
def cluster_env(
    spark_cluster: Cluster,
    s3_store: S3Store,
    kafka_broker: KafkaBroker,
    postgres: Path,
    kafka_jars_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """The environment a user has on the cluster profile: ``CONFLUX_PROFILE=cluster`` and
    nothing else of Conflux's but where the broker is (the master, the roots and the store's
    endpoint and credentials come from the profile: the running cluster's ``cluster.json``, the
    store's saved credentials), Dagster's instance on PostgreSQL."""
    saved = spark_cluster.runtime / "s3" / "credentials.json"
    saved.parent.mkdir(exist_ok=True)  # the store runs from the module's own runtime folder
    shutil.copy2(s3_store.runtime_dir / "s3" / "credentials.json", saved)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONFLUX_", "AWS_"))}
    jvm = dict(TEST_DRIVER_CONF)
    jvm["spark.executor.defaultJavaOptions"] = TEST_DRIVER_JVM_OPTIONS  # short-lived executors
    env.update(
        CONFLUX_PROFILE="cluster",
        CONFLUX_RUNTIME_DIR=str(spark_cluster.runtime),
        CONFLUX_JARS_DIR=str(kafka_jars_dir),
        CONFLUX_FLOWS_DIR=str(tmp_path_factory.mktemp("cluster-flows")),
        CONFLUX_KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap_servers,
        CONFLUX_SPARK_CONF=json.dumps(jvm),
        DAGSTER_HOME=str(postgres / "dagster-cluster"),
        PGPASSFILE=str(postgres / "postgres" / "pgpass"),
    )
    return env


def settings_of(env: dict[str, str]) -> Settings:
    return load_settings(environ=env)


def dagster(env: dict[str, str], *args: str) -> str:
    """``dagster <args>`` on the profile's instance; its output (fails the test on a failure)."""
    done = subprocess.run(
        [str(BIN / "dagster"), *args, "-m", "assets.definitions", "-a", "defs"],
        env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{output[:3000]}\n[...]\n{output[-3000:]}"
    return output


def gold_flow(topic: str) -> dict[str, Any]:
    return {
        "name": "cl_shop",
        "source": {"kind": "kafka", "topics": [topic], "starting_offsets": "earliest"},
        "target": {"table": "bronze_cl_shop"},
        "silver": {
            "format": "json",
            "schema": ORDER_SCHEMA,
        },
        "gold": [
            {
                "table": "cl_revenue",
                "event_time": "ts",
                "allowed_lateness": "5 minutes",
                "window": {"duration": "10 minutes"},
                "group_by": ["product"],
                "aggregates": AGGREGATES,
            }
        ],
    }


def applications(output: str) -> dict[str, list[int]]:
    """Per application the runners reported: the tasks each of its executors completed."""
    return {
        app: [int(n) for n in re.findall(r"executor \d+ at [\d.:]+: (\d+) tasks", executors)]
        for app, executors in re.findall(r"application (app-[\d-]+) on spark://\S+: (.*)", output)
    }


def master_view(cluster: Cluster) -> dict[str, Any]:
    """The master's own account of the cluster: its workers and applications."""
    with urllib.request.urlopen(f"{cluster.state['master_ui']}/json/", timeout=5) as reply:
        return dict(json.loads(reply.read()))


def master_applications(cluster: Cluster) -> list[str]:
    view = master_view(cluster)
    return [app["id"] for app in [*view["activeapps"], *view["completedapps"]]]


def test_flows_from_dagster_run_on_the_cluster_and_equal_the_model(
    cluster_env: dict[str, str], spark_cluster: Cluster, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    flows = Path(cluster_env["CONFLUX_FLOWS_DIR"])
    create_topic(kafka_broker.bootstrap_servers, "cl_orders", partitions=1)
    write_spec(flows, gold_flow("cl_orders"))
    # the 20th's orders, then one of the next day: its watermark closes the 20th
    orders = [order(1, 1, "a", 10.0), order(2, 3, "b", 20.0), order(3, 12, "a", 5.5)]
    orders += [order(4, 25, "b", 7.0), order(5, 31, "a", 4.0), order(6, 28, "b", 2.0)]
    orders += [order(7, 15 * 60, "b", 1.0)]
    send(kafka_broker, "cl_orders", 0, orders)

    ran = dagster(cluster_env, "job", "execute", "-j", "ingest_incremental")
    [(app, tasks)] = applications(ran).items()  # the gold flow's
    work = spark_cluster.runtime / "spark-cluster" / "work"
    assert len(tasks) == 2 and min(tasks) > 0, (app, tasks)  # an executor on each worker ran
    assert (work / "worker-1" / app).is_dir() and (work / "worker-2" / app).is_dir(), app

    settings = settings_of(cluster_env)
    revenue = gold_path(settings, "cl_revenue")
    assert revenue.uri.startswith("s3a://conflux/lake/")
    assert read_gold(revenue, ["product"]) == expected_gold(orders, TEN, None, ["product"])

    # The closed day is recomputed without a person: the spec's backfill schedule, ticked by the
    # daemon on PostgreSQL, launches a run over the last closed date (the 20th) on the cluster.
    scheduled = gold_flow("cl_orders")
    scheduled["gold"][0]["backfill"] = {"schedule": "* * * * *", "dates": 1}
    write_spec(flows, scheduled)
    before = delta_table(revenue).version()
    tick, run = scheduled_backfill(cluster_env, tmp_path / "daemon.log")
    assert run.tags["dagster/asset_partition_range_start"] == DAY.isoformat(), run.tags
    assert run.tags["dagster/asset_partition_range_end"] == DAY.isoformat(), run.tags
    assert run.run_id in tick.run_ids
    day = [o for o in orders if o["ts"].date() == DAY]
    where = f"_event_date = '{DAY.isoformat()}'"
    assert delta_table(revenue).version() > before  # the day was rewritten, to the same sums
    assert read_gold(revenue, ["product"], where) == expected_gold(day, TEN, None, ["product"])

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PGPASSFILE", cluster_env["PGPASSFILE"])  # the password: never in the URL
        instance = DagsterInstance.from_config(cluster_env["DAGSTER_HOME"])
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        assert "ingest_incremental" in {r.job_name for r in runs}
        instance.dispose()


BACKFILL_SCHEDULE = "backfill_cl_revenue_schedule"


def scheduled_backfill(env: dict[str, str], log: Path) -> tuple[Any, Any]:
    """Run ``dagster-daemon`` until the backfill schedule's first tick has launched a run and
    that run succeeded; the schedule is stopped (in storage, as ``dagster schedule stop`` does)
    as soon as its run exists, so no second tick launches another. Returns (tick, run)."""
    output = log.open("w")
    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-m", "assets.definitions", "-a", "defs"],
        env=env, cwd=PROJECT_ROOT, stdout=output, stderr=subprocess.STDOUT,
        start_new_session=True,  # its code server and the runs it launches: one group
    )  # fmt: skip
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PGPASSFILE", env["PGPASSFILE"])
            instance = DagsterInstance.from_config(env["DAGSTER_HOME"])
            tagged = RunsFilter(tags={"dagster/schedule_name": BACKFILL_SCHEDULE})
            [launched] = wait_for(lambda: instance.get_runs(tagged), 300, "a tick's run", every=2)
            [state] = [
                s
                for s in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)
                if s.name == BACKFILL_SCHEDULE
            ]
            instance.update_instigator_state(state.with_status(InstigatorStatus.STOPPED))
            finished = wait_for(
                lambda: (r := instance.get_run_by_id(launched.run_id)) and r.is_finished and r,
                600, "the scheduled backfill run", every=2,
            )  # fmt: skip
            assert finished.status == DagsterRunStatus.SUCCESS, log.read_text()[-4000:]
            ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id)
            [tick] = [t for t in ticks if t.status == TickStatus.SUCCESS]
            instance.dispose()
            return tick, finished
    finally:
        end_group(daemon)
        kill_applications("cl_shop")  # a run cut short leaves its application behind
        output.close()


def test_a_flow_with_a_local_table_is_refused_before_spark_starts(
    cluster_env: dict[str, str], spark_cluster: Cluster, s3_store: S3Store, tmp_path: Path
) -> None:
    flows = tmp_path / "flows"
    write_spec(
        flows,
        {
            "name": "cl_local",
            "source": {"kind": "kafka", "topics": ["cl_local"]},
            "target": {"table": "bronze_cl_local", "path": str(tmp_path / "bronze_cl_local")},
        },
    )
    env = {**cluster_env, "CONFLUX_FLOWS_DIR": str(flows)}
    before = master_applications(spark_cluster)
    done = subprocess.run(
        [str(BIN / "conflux"), "run", "cl_local", "--once"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(
        r"target.path: the bronze table's location .*bronze_cl_local is a local path, but Spark "
        r"runs on a cluster \(spark://127\.0\.0\.1:\d+\).*give it an s3a:// path there",
        done.stderr,
    ), done.stderr
    # refused by the launcher: no lease taken, no application registered, nothing written
    listed = s3_store.connection.client().list_objects_v2(Bucket="conflux", Prefix="checkpoints/")
    assert not [o["Key"] for o in listed.get("Contents", []) if "/cl_local/" in f"/{o['Key']}"]
    assert master_applications(spark_cluster) == before
    assert not (tmp_path / "bronze_cl_local").exists()


def test_workers_cannot_see_the_drivers_runtime_folder(spark_cluster: Cluster) -> None:
    lake = spark_cluster.runtime / "lake"
    lake.mkdir(exist_ok=True)
    (lake / "driver-only.txt").write_text("the driver's disk")
    for worker in spark_cluster.state["worker_pids"]:

        def inside(*command: str, worker: int = worker) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["nsenter", "-t", str(worker), "-m", "--", *command],
                capture_output=True, text=True, check=False,
            )  # fmt: skip

        listed = inside("ls", "-A", str(spark_cluster.runtime))
        assert listed.returncode == 0 and listed.stdout.split() == ["spark-cluster"], listed
        assert inside("test", "-e", str(lake / "driver-only.txt")).returncode == 1
        wrote = inside("touch", str(spark_cluster.runtime / "lake"))
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, wrote
        assert inside("test", "-x", sys.executable).returncode == 0  # the project is visible
    assert spark_cluster.state["isolation"] == "namespace"


# --- faults on the cluster (the module's last test: under ``make chaos`` it leaves a worker dead) -


def worker_of(executor: int, cluster: Cluster) -> int:
    """The worker daemon (pid) an executor JVM runs under: its parent."""
    worker = parent_pid(executor)
    assert worker in cluster.state["worker_pids"], (executor, worker)
    return worker


def executors(cluster: Cluster) -> dict[int, str]:
    """The executor JVMs the workers run now: pid -> ``app-…/<executor id>``."""
    found = {}
    for pid in processes_matching("CoarseGrainedExecutorBackend"):
        args = command_line(pid).split()
        if "--app-id" in args and parent_pid(pid) in cluster.state["worker_pids"]:
            found[pid] = (
                f"{args[args.index('--app-id') + 1]}/{args[args.index('--executor-id') + 1]}"
            )
    return found


def application_group(
    lease_dir: Location, not_owner: str | None = None
) -> tuple[str, ApplicationGroup]:
    """The lease owner and process group of the flow's running application (a launcher of a
    Dagster run started it: its spark-submit JVM leads the group, the Python driver below it)."""

    def found() -> tuple[str, ApplicationGroup] | None:
        term = latest_term(lease_dir)
        if term is None or term.released or term.owner == not_owner:
            return None
        pgid = spark_application_pgid(term.owner)
        return (term.owner, ApplicationGroup(pgid)) if pgid is not None else None

    return wait_for(found, 300, "the flow's application")


def end_group(process: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """SIGTERM the process group ``process`` leads, SIGKILL it if it outlives ``timeout``."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def kill_applications(flow: str) -> None:
    """SIGKILL the process group of every Spark application of ``flow`` still running."""
    for pid in processes_matching(f"{flow}.yaml"):
        if "SparkSubmit" in command_line(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def gone(pid: int) -> bool:
    """``pid`` exited (a zombie no one reaped yet counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def orphan_executor_left(pid: int, timeout: float) -> str | None:
    """Wait for the executor of a killed Worker to exit: Spark's WorkerWatcher ends it when the
    Worker's connection drops. That is Spark's behaviour, not Conflux's, and in CI after 9b9edda
    (the module's first such case) the orphan lived past 120 s. Then its threads are recorded
    (``jstack``, in a warning pytest prints) and it is killed, as a process supervisor would;
    the test goes on, since the master has marked its Worker dead and ``executors`` counts only
    a live Worker's children. Returns what the orphan was doing, or None if it exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return None
        time.sleep(1.0)
    dump = subprocess.run(
        ["jstack", str(pid)], capture_output=True, text=True, timeout=60, check=False
    )
    threads = [
        block.splitlines()[:4] for block in dump.stdout.split("\n\n") if block.startswith('"')
    ]
    busy = ["; ".join(line.strip() for line in lines) for lines in threads
            if any(word in lines[0] for word in ("main", "Shutdown", "Thread-", "WorkerWatcher"))]  # fmt: skip
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    what = f"executor {pid} outlived its killed Worker by {timeout:.0f} s; its threads: {busy}"
    warnings.warn(what, stacklevel=2)
    return what


def dead_workers(cluster: Cluster) -> list[str]:
    return [w["id"] for w in master_view(cluster)["workers"] if w["state"] != "ALIVE"]


def test_executor_worker_and_driver_killed_mid_batch_lose_nothing(
    cluster_env: dict[str, str], spark_cluster: Cluster, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A CDC flow (current state and history) runs continuously on the cluster under Dagster;
    in silver batches, each caught mid-batch with the driver frozen (SIGSTOP) so where the fault
    lands is read, not guessed, one thing dies by SIGKILL: an executor, and under ``make chaos``
    then a Worker daemon (with it, normally, its executor) and the driver. Spark replaces the
    executor (on the surviving worker after the worker's death), the flow asset's retry policy
    starts a new application after the driver's death; nobody intervenes. Every table then equals
    the plain-Python model and each batch's MERGE is committed once. Under ``make chaos`` the
    retry is recorded in Dagster's event log on PostgreSQL; in the suite there is none (Spark
    recovered by itself) and the lease is still the first application's.

    The suite strikes the executor only: what that proves is the cluster's own (the tasks of a lost
    executor run again on a new one, and Delta commits only the files of the tasks that finished).
    The Worker's death adds to it Spark's standalone scheduling alone (the master drops the worker,
    the survivor gets the new executor), at the price of a catch-up on one worker: two thirds of
    the test in the suite (bench/HISTORY.md, "Suite, seventeenth session"). The driver's kill costs
    a second application (~90 CPU-seconds, a fifth of this module's, measured alone; "Suite, ninth
    session"), and its parts are proven in the suite apart: the retry policy restarting a
    SIGKILLed application from its checkpoint on the local profile (``test_continuous_run``,
    killed between batches), a batch replayed exactly once after a kill mid-batch by the kill
    tests of ``tests/integration``. Their combination on the cluster (a new application getting
    executors after its driver's death, with one worker dead) is left to ``make chaos``."""
    flows = Path(cluster_env["CONFLUX_FLOWS_DIR"])
    bootstrap = kafka_broker.bootstrap_servers
    stream = CdcStream.make(FAULT_KEYS, seed=26)
    sent = stream.kafka_records()
    trigger = {"mode": "continuous", "interval": "1 second", "restart_delay": "2 seconds"}
    # Bronze in a batch per strike, at least two (a file per partition each), silver a file per
    # batch: at least twice as many silver batches as strikes, which leaves room for each strike
    # (a pause that misses its batch tries the next) and few batches after the last. The
    # application the retry policy starts (make chaos) reads the spec again: it catches up in one
    # batch after the replay (see strike 3).
    strikes = 3 if FULL_SCHEDULE else 1
    per_trigger = len(sent) // max(strikes, 2) + 1
    flow = silver_flow("cl_faults", "cl_faults", trigger, max_offsets_per_trigger=per_trigger)
    flow["silver"]["max_files_per_trigger"] = 1
    spec = load_spec(write_spec(flows, flow))
    settings = settings_of(cluster_env)
    paths = SilverPaths.of(spec, settings)
    files, lease_dir = paths.history_files(), FlowState.of(spec, settings).lease_dir
    produce_cdc(bootstrap, "cl_faults", sent, partitions=2)
    log = (tmp_path / "run.log").open("w")
    run = subprocess.Popen(
        [str(BIN / "dagster"), "job", "execute", "-j", "run_cl_faults",
         "-m", "assets.definitions", "-a", "defs"],
        env=cluster_env, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,  # the run and its step processes: one group
    )  # fmt: skip
    rng, aim = random.Random(26), Aim(MID_BATCH)
    drivers: list[ApplicationGroup] = []  # killed in the end if a failure left one running
    started, phases = time.monotonic(), {}

    def mid_batch(group: ApplicationGroup, strike: Callable[[], None] | None = None) -> int:
        delay = lambda: rng.uniform(0.3, 1.5)  # noqa: E731  (a batch here lasts seconds)
        landing = kill_mid_batch(group, files, aim, delay, strike=strike, poll=0.1)
        return landing.batch_id

    try:
        owner, driver = application_group(lease_dir)
        drivers.append(driver)
        phases["application"] = time.monotonic() - started
        # 1. An executor dies mid-batch: Spark runs its tasks again and starts a new executor.
        killed: dict[str, str] = {}

        def kill_an_executor() -> None:
            pid, executor = sorted(executors(spark_cluster).items())[0]
            os.kill(pid, signal.SIGKILL)
            killed["executor"] = executor

        struck = [mid_batch(driver, kill_an_executor)]
        phases["executor killed"] = time.monotonic() - started
        app = killed["executor"].rpartition("/")[0]
        wait_for(
            lambda: any(e.startswith(app) and e != killed["executor"]
                        for e in executors(spark_cluster).values())
            and len(executors(spark_cluster)) == 2,
            120, "a new executor in place of the killed one",
        )  # fmt: skip
        # 2. (make chaos) A Worker daemon dies mid-batch: its executor goes with it; one worker
        # carries on.

        def kill_a_worker() -> None:
            pid, _executor = sorted(executors(spark_cluster).items())[-1]
            killed["worker"], killed["its executor"] = str(worker_of(pid, spark_cluster)), str(pid)
            os.kill(int(killed["worker"]), signal.SIGKILL)

        outlived = None
        if FULL_SCHEDULE:
            struck.append(mid_batch(driver, kill_a_worker))
            phases["worker killed"] = time.monotonic() - started
            wait_for(lambda: len(dead_workers(spark_cluster)) == 1, 120, "the master to drop it")
            outlived = orphan_executor_left(int(killed["its executor"]), timeout=120)
            survivor = {p for p in spark_cluster.state["worker_pids"] if str(p) != killed["worker"]}
            wait_for(  # the survivor has a core to spare: Spark starts a second executor there
                lambda: len(now := executors(spark_cluster)) == 2
                and {parent_pid(p) for p in now} == survivor,
                120, "a new executor on the surviving worker",
            )  # fmt: skip

        # 3. (make chaos) The driver dies mid-batch: the flow asset's retry policy launches it
        # again.
        def kill_the_driver() -> None:
            del flow["silver"]["max_files_per_trigger"]  # read by the next launch only
            write_spec(flows, flow)
            driver.kill()

        restarted = owner
        if FULL_SCHEDULE:
            struck.append(mid_batch(driver, kill_the_driver))
            phases["driver killed"] = time.monotonic() - started
            restarted, again = application_group(lease_dir, not_owner=owner)
            drivers.append(again)
            phases["restarted"] = time.monotonic() - started
        wait_for(lambda: caught_up(paths, stream), 600, "the flow to catch up", every=3)
        phases["caught up"] = time.monotonic() - started
        assert run.poll() is None, "the Dagster run ended after the strikes"
        stop = subprocess.run(
            [str(BIN / "conflux"), "stop", "cl_faults"],
            env=cluster_env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert run.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-4000:]
    finally:
        end_group(run)
        for group in drivers:  # its own session: the launcher's death spares it
            if group.running():
                group.kill()
        kill_applications("cl_faults")  # one launched after the last the test found
        log.close()
    phases["stopped"] = time.monotonic() - started
    print(f"seconds since launch: { {k: round(v) for k, v in phases.items()} }")
    print(f"struck mid-batch: silver batches {struck} ({aim.rate()}, misses {aim.misses}); "
          f"killed executor {killed['executor']}, worker pid {killed.get('worker')}; {outlived or ''}")  # fmt: skip
    assert len(set(struck)) == strikes, struck

    check_silver_tables(paths, stream)
    events_txns = paths.events_files().txn_commits()
    assert not {k: v for k, v in events_txns.items() if len(v) != 1}, events_txns

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PGPASSFILE", cluster_env["PGPASSFILE"])
        instance = DagsterInstance.from_config(cluster_env["DAGSTER_HOME"])
        [record] = instance.get_runs(RunsFilter(job_name="run_cl_faults"))
        assert record.status == DagsterRunStatus.SUCCESS
        kinds = {e.dagster_event.event_type for e in instance.all_logs(record.run_id)
                 if e.dagster_event is not None}  # fmt: skip
        retried = {DagsterEventType.STEP_UP_FOR_RETRY, DagsterEventType.STEP_RESTARTED}
        assert (retried <= kinds) if FULL_SCHEDULE else not (retried & kinds), kinds
        instance.dispose()
    term = latest_term(lease_dir)  # a released term keeps its owner
    assert term is not None and term.owner == restarted, (term, restarted)
    assert (restarted != owner) == FULL_SCHEDULE, (restarted, owner)


def caught_up(paths: SilverPaths, stream: CdcStream) -> bool:
    """Every delivered change is in the events table and the current table equals the model."""
    try:
        check_events(paths, stream)
        check_current_state(paths, stream)
    except (AssertionError, OSError):
        return False
    return True

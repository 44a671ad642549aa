"""The cluster profile end to end: flows launched from Dagster (its runs in PostgreSQL) run on the
project's Spark standalone cluster, whose workers cannot see the driver's runtime folder, with
every table, checkpoint and lease on the S3 store.

One cluster (a master, two workers), one PostgreSQL and one S3 store for the module, started by
their ``platform/`` managers as a user starts them; Dagster runs as the ``dagster`` command (a
process of its own: a Spark driver in this test process would pin the worker's session to the
cluster). Data are small: what is proven is where the work runs and that it is exact there.
Needs root (the workers' mount namespaces, PostgreSQL run as its own user), as CI has.

1. :func:`test_flows_from_dagster_run_on_the_cluster_and_equal_the_model`: a CDC flow (current
   state + history) and a gold flow with late rows, launched by ``ingest_incremental`` and a
   second run; every table, read with delta-rs from the store, equals the plain-Python model; the
   late rows land in the late table and a partitioned backfill of their day reconciles gold; in
   every application an executor on each worker ran tasks; the runs and the backfill's partition
   are recorded in PostgreSQL.
2. :func:`test_a_flow_with_a_local_table_is_refused_before_spark_starts`: by the launcher, before
   its lease is taken or an application registers with the master.
3. :func:`test_workers_cannot_see_the_drivers_runtime_folder`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from pipelines.settings import PROJECT_ROOT, Settings, load_settings
from pipelines.spec import load_spec
from tests.conftest import DEFAULT_JAVA_OPTIONS, TEST_DRIVER_JVM_OPTIONS
from tests.integration.test_bronze_exactly_once import write_spec
from tests.integration.test_gold import AGGREGATES, ORDER_SCHEMA, TEN, order, send
from tests.integration.test_silver import (
    CdcStream,
    SilverPaths,
    check_current_state,
    check_events,
    check_history,
    check_quarantine,
    silver_flow,
)
from tests.support.cdc import produce_cdc
from tests.support.delta_read import read_rows
from tests.support.gold import expected_gold, read_gold
from tests.support.kafka import create_topic
from tests.support.runtime import KafkaBroker, S3Store, ServiceCli
from tests.support.tables import gold_path

pytestmark = pytest.mark.timeout(1800)
BIN = Path(sys.executable).parent
CLUSTER_SCRIPT = PROJECT_ROOT / "platform" / "spark" / "cluster.py"
POSTGRES_SCRIPT = PROJECT_ROOT / "platform" / "postgres" / "server.py"
CDC_KEYS = 30
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
    jvm = {DEFAULT_JAVA_OPTIONS: TEST_DRIVER_JVM_OPTIONS}
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


def master_applications(cluster: Cluster) -> list[str]:
    with urllib.request.urlopen(f"{cluster.state['master_ui']}/json/", timeout=5) as reply:
        view = json.loads(reply.read())
    return [app["id"] for app in [*view["activeapps"], *view["completedapps"]]]


def test_flows_from_dagster_run_on_the_cluster_and_equal_the_model(
    cluster_env: dict[str, str], spark_cluster: Cluster, kafka_broker: KafkaBroker
) -> None:
    flows = Path(cluster_env["CONFLUX_FLOWS_DIR"])
    bootstrap = kafka_broker.bootstrap_servers
    stream = CdcStream.make(CDC_KEYS, seed=24)
    produce_cdc(bootstrap, "cl_customers", stream.kafka_records(), partitions=2)
    cdc = load_spec(
        write_spec(flows, silver_flow("cl_cdc", "cl_customers", {"mode": "available_now"}))
    )
    create_topic(bootstrap, "cl_orders", partitions=1)
    write_spec(flows, gold_flow("cl_orders"))
    first = [order(1, 1, "a", 10.0), order(2, 3, "b", 20.0), order(3, 12, "a", 5.5)]
    first += [order(4, 25, "b", 7.0), order(5, 31, "a", 4.0)]  # newest 10:31: watermark 10:26
    send(kafka_broker, "cl_orders", 0, first)

    ran = dagster(cluster_env, "job", "execute", "-j", "ingest_incremental")
    # late for its closed window [10:00, 10:10); then an order of the next day closes the 20th
    second = [order(6, 2, "a", 100.0), order(7, 28, "b", 2.0), order(8, 15 * 60, "b", 1.0)]
    send(kafka_broker, "cl_orders", 0, second)
    ran += dagster(cluster_env, "job", "execute", "-j", "run_cl_shop")
    reported = applications(ran)
    assert len(reported) == 3, ran[-3000:]  # the CDC flow's, the gold flow's twice
    work = spark_cluster.runtime / "spark-cluster" / "work"
    for app, tasks in reported.items():  # each application's two executors, one per worker, ran
        assert len(tasks) == 2 and min(tasks) > 0, (app, tasks)
        assert (work / "worker-1" / app).is_dir() and (work / "worker-2" / app).is_dir(), app

    settings = settings_of(cluster_env)
    paths = SilverPaths.of(cdc, settings)
    assert paths.current.uri.startswith("s3a://conflux/lake/")
    check_current_state(paths, stream)
    check_history(paths, stream)
    check_events(paths, stream)
    check_quarantine(paths, stream)

    late = read_rows(gold_path(settings, "cl_revenue_late"), ["_source_offset"])
    assert sorted(r["_source_offset"] for r in late) == [5]  # order 6, offset 5
    revenue = gold_path(settings, "cl_revenue")
    on_time = [*first, *second[1:]]
    assert read_gold(revenue, ["product"]) == expected_gold(on_time, TEN, None, ["product"])

    dagster(
        cluster_env, "asset", "materialize", "--select", "backfill/cl_revenue",
        "--partition", DAY.isoformat(),
    )  # fmt: skip
    day = [o for o in [*first, *second] if o["ts"].date() == DAY]
    where = f"_event_date = '{DAY.isoformat()}'"
    assert read_gold(revenue, ["product"], where) == expected_gold(day, TEN, None, ["product"])

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PGPASSFILE", cluster_env["PGPASSFILE"])  # the password: never in the URL
        instance = DagsterInstance.from_config(cluster_env["DAGSTER_HOME"])
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        assert {r.job_name for r in runs} >= {"ingest_incremental", "run_cl_shop"}
        backfills = [r for r in runs if r.tags.get("dagster/partition") == DAY.isoformat()]
        assert backfills, [dict(r.tags) for r in runs]
        instance.dispose()


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

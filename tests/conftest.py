"""Session fixtures shared by integration and end-to-end tests: ONE real local Kafka broker and ONE
SparkSession per test process (the whole run, or each pytest-xdist worker: `make test` runs the
suite on every core with ``--dist loadfile``, so a module's tests and module fixtures stay in one
process), in temporary runtime folders, with the real jars from ``make setup``. A missing
runtime fails the tests; it never skips them."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.errors import ConfigError
from pipelines.jvm import SHORT_RUN_DRIVER_OPTIONS, check_java, require_jars
from pipelines.settings import Settings, load_settings
from pipelines.spark import get_spark_session
from pipelines.storage import S3Connection
from tests.support.runtime import S3_STORE_SCRIPT, KafkaBroker, S3Store, ServiceCli

#: JVM options of the short-lived Spark drivers the suite starts (spark-submit launches, Dagster
#: runs), prepended to Conflux's own through Spark's ``defaultJavaOptions``: C1 alone
#: (:data:`pipelines.jvm.SHORT_RUN_DRIVER_OPTIONS` says why). Not for the suite's own session,
#: which runs a whole worker's modules.
DEFAULT_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
TEST_DRIVER_JVM_OPTIONS = SHORT_RUN_DRIVER_OPTIONS
#: JVM options of the suite's own session (one per worker, alive for all of the worker's modules):
#: C2 kept, but a method must run five times as often as by default before C2 compiles it. Each
#: test's queries bring classes of their own (Spark's generated code, each plan's closures) that
#: run a few thousand times and are never seen again; C2 spent 142 of 732 CPU-seconds compiling
#: them in a serial run of test_gold + test_silver_json (89 of 632 with this, 462 -> 420 s).
#: 20x was slower (515 s): the hot paths then stay in C1 code too long. bench/HISTORY.md.
TEST_SESSION_JVM_OPTIONS = (
    "-XX:Tier4InvocationThreshold=25000 -XX:Tier4MinInvocationThreshold=3000 "
    "-XX:Tier4CompileThreshold=75000 -XX:Tier4BackEdgeThreshold=200000"
)


#: Spark settings of every Spark the suite runs (its own session, the drivers it launches, the
#: cluster's executors): expressions evaluated by Spark's interpreter instead of Java source
#: generated and compiled per plan. The suite's data are a few rows to a few thousand, and nearly
#: every query plan is new (each test's schemas, each MERGE's conditions), so compiling code for
#: it (Janino, then the JIT on the compiled classes) costs more CPU than the rows ever need:
#: ``test_silver_json`` alone, idle machine, 122 s with code generation, 114 s without
#: whole-stage code only, 92 s with neither (bench/HISTORY.md, "Generated code compiled again
#: every batch"). Both paths are Spark's own and give the same results (Spark's tests run each
#: expression both ways); nothing Conflux runs outside the suite sets them: the demo, the
#: benchmarks (``make bench-quick`` too) and ``make chaos`` keep code generation.
TEST_SPARK_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
#: The Spark settings of the drivers the suite launches (and of its own session, whose JVM options
#: the ``spark`` fixture replaces): the two above together.
TEST_DRIVER_CONF = {DEFAULT_JAVA_OPTIONS: TEST_DRIVER_JVM_OPTIONS, **TEST_SPARK_CONF}


TESTS = Path(__file__).resolve().parent
#: Seconds each module took in a full run of the suite on two workers (ci20, bench/HISTORY.md,
#: "SIGTERM ignored in half the suite"; the waits that run lost to ignored SIGTERMs taken off;
#: test_cluster's and test_silver's estimated after later cuts: "Suite, eighteenth session"),
#: rounded. pytest-xdist hands modules out in this order, so the heaviest go first and the last to
#: finish is a short one, not a five-minute module run alone on one core. Modules under 15 s are
#: left out: they keep their collection order, after these.
MODULE_SECONDS = {
    "e2e/test_cluster.py": 300,
    "e2e/test_continuous_run.py": 200,
    "e2e/test_ui_surface.py": 195,
    "e2e/test_flow_runs.py": 140,
    "e2e/test_definitions.py": 30,
    "integration/test_debezium_source.py": 150,
    "integration/test_gold.py": 150,
    "integration/test_silver.py": 100,
    "integration/test_gold_join.py": 115,
    "integration/test_quality.py": 110,
    "integration/test_silver_json.py": 90,
    "integration/test_one_writer.py": 85,
    "integration/test_bronze_exactly_once.py": 75,
    "integration/test_maintenance.py": 75,
    "integration/test_flows_on_object_store.py": 70,
    "integration/test_fused_batch.py": 70,
    "integration/test_source_faults.py": 65,
    "integration/test_debezium_changes.py": 55,
    "integration/test_runner.py": 35,
    "integration/test_debezium_values.py": 30,
    "integration/test_kafka_broker.py": 15,
    "integration/test_object_store.py": 15,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each test package, heaviest modules first (:data:`MODULE_SECONDS`).

    The packages keep their order (e2e, integration, unit), so each worker still runs a package's
    modules one after the other and sets up a package fixture (``dagster dev``) once. A stable
    sort: each module's tests keep their order and stay together."""

    def weight(item: pytest.Item) -> tuple[str, int]:
        path = item.path.resolve()
        name = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
        return name.partition("/")[0], -MODULE_SECONDS.get(name, 0)

    items.sort(key=weight)


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT and SIGTERM handled as in a terminal, even where the suite started with them ignored.

    A script's background job starts with SIGINT ignored (POSIX shells without job control), and
    so does every process it starts. Dagster's processes then point SIGTERM at that ignored
    handler (``dagster._utils.interrupts.setup_interrupt_handlers``, "for k8s"): a pytest worker
    after its first in-process ``materialize``, and every ``dagster dev`` or run worker it starts.
    An ignored signal stays ignored across exec, and a JVM started with SIGTERM ignored never
    installs its shutdown handler, so each ``stop`` of a broker, S3 store or Connect worker started
    afterwards (and of ``dagster dev``, which ignored SIGTERM itself) waited out its timeout and
    ended in SIGKILL: 30-90 s at a time, ~4 minutes of one worker's wall in ci20 (bench/HISTORY.md,
    "SIGTERM ignored in half the suite"). With Python's own SIGINT handler and SIGTERM's default
    here, every process the suite starts begins with both signals at their defaults."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(scope="session", autouse=True)
def spark_scratch_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every Spark JVM the suite starts (its session, spark-submit launches, Dagster runs) keeps
    its scratch (``spark-*/userFiles``: ~50 MB of jars copied per driver, ``blockmgr-*``) under
    pytest's temporary folder, not ``/tmp``. A driver the suite kills with SIGKILL never deletes
    its own; pytest removes its folders but the last three runs', so they cannot pile up on a
    machine that runs the suite again and again (hundreds were left in ``/tmp`` on one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_LOCAL_DIRS", str(tmp_path_factory.mktemp("spark-scratch")))
        yield


@pytest.fixture(scope="session")
def kafka_jars_dir() -> Path:
    """The real jars folder (``load_settings().jars_dir``); fails, never skips, if it is missing."""
    jars_dir = load_settings().jars_dir
    try:
        check_java()
        require_jars(jars_dir / "kafka", "Kafka broker")
    except ConfigError as exc:
        pytest.fail(f"integration tests need the runtime: {exc}")
    return jars_dir


@pytest.fixture(scope="session")
def broker_cli(kafka_jars_dir: Path) -> ServiceCli:
    """Runs ``broker.py`` with the real jars and an isolated runtime folder per call."""
    return ServiceCli(kafka_jars_dir)


@pytest.fixture(scope="session")
def kafka_broker(
    broker_cli: ServiceCli, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBroker]:
    """ONE broker for the whole session in a temporary runtime folder; stopped at the end."""
    runtime_dir = tmp_path_factory.mktemp("kafka-runtime")
    try:
        result = broker_cli.run("start", "--timeout", "120", runtime_dir=runtime_dir)
        if result.returncode != 0:
            pytest.fail(f"the session Kafka broker did not start:\n{broker_cli.describe(result)}")
        state = broker_cli.parse(result)
        yield KafkaBroker(state["bootstrap_servers"], runtime_dir, state["pid"], state)
    finally:
        stopped = broker_cli.run("stop", runtime_dir=runtime_dir, timeout=90)
        assert stopped.returncode == 0, broker_cli.describe(stopped)


@pytest.fixture(scope="module")
def s3_store(kafka_jars_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    """ONE local S3 store (s3proxy) for the module that asks for it, in a temporary runtime
    folder; stopped when the module ends (a JVM less beside the rest of the worker's modules)."""
    runtime_dir = tmp_path_factory.mktemp("s3-runtime")
    cli = ServiceCli(kafka_jars_dir, S3_STORE_SCRIPT)
    try:
        result = cli.run("start", "--timeout", "120", runtime_dir=runtime_dir)
        if result.returncode != 0:
            pytest.fail(f"the session S3 store did not start:\n{cli.describe(result)}")
        state = cli.parse(result)
        saved = json.loads(Path(state["credentials_file"]).read_text())
        connection = S3Connection(
            state["endpoint"], saved["access_key_id"], saved["secret_access_key"], state["region"]
        )
        yield S3Store(connection, runtime_dir, state["pid"], state["bucket"])
    finally:
        stopped = cli.run("stop", runtime_dir=runtime_dir, timeout=60)
        assert stopped.returncode == 0, cli.describe(stopped)


@pytest.fixture(scope="session")
def spark_settings(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings of the test session: a temporary runtime folder, the real jars, the test broker."""
    runtime_dir = tmp_path_factory.mktemp("runtime")
    return replace(
        load_settings(),
        runtime_dir=runtime_dir,
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers,
        flows_dir=runtime_dir / "flows",
        spark_conf={**TEST_DRIVER_CONF, **load_settings().spark_conf},
    )


@pytest.fixture(scope="session")
def spark(spark_settings: Settings) -> Iterator[SparkSession]:
    """One SparkSession (Delta + Kafka connector) for the whole integration session, UI off,
    with C2 (it runs for the whole session) at the thresholds of :data:`TEST_SESSION_JVM_OPTIONS`."""
    conf = {**spark_settings.spark_conf, DEFAULT_JAVA_OPTIONS: TEST_SESSION_JVM_OPTIONS}
    session = get_spark_session("conflux-tests", replace(spark_settings, spark_conf=conf), ui=False)
    yield session
    session.stop()

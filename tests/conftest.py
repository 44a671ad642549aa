"""Session fixtures shared by integration and end-to-end tests: ONE real local Kafka broker and ONE
SparkSession per test process (the whole run, or each pytest-xdist worker: `make test` runs the
suite on every core with ``--dist loadfile``, so a module's tests and module fixtures stay in one
process), in temporary runtime folders, with the real jars from ``make setup``. A missing
runtime fails the tests; it never skips them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, require_jars
from pipelines.settings import Settings, load_settings
from pipelines.spark import get_spark_session
from tests.support.runtime import BrokerCli, KafkaBroker


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
def broker_cli(kafka_jars_dir: Path) -> BrokerCli:
    """Runs ``broker.py`` with the real jars and an isolated runtime folder per call."""
    return BrokerCli(kafka_jars_dir)


@pytest.fixture(scope="session")
def kafka_broker(
    broker_cli: BrokerCli, tmp_path_factory: pytest.TempPathFactory
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


@pytest.fixture(scope="session")
def spark_settings(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings of the test session: a temporary runtime folder, the real jars, the test broker."""
    runtime_dir = tmp_path_factory.mktemp("runtime")
    return replace(
        load_settings(),
        runtime_dir=runtime_dir,
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers,
        flows_dir=runtime_dir / "flows",
    )


@pytest.fixture(scope="session")
def spark(spark_settings: Settings) -> Iterator[SparkSession]:
    """One SparkSession (Delta + Kafka connector) for the whole integration session, UI off."""
    session = get_spark_session("conflux-tests", spark_settings, ui=False)
    yield session
    session.stop()

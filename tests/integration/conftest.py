"""Fixtures for integration tests: one real local Kafka broker shared by the whole test session.

The broker is started through ``platform/kafka/broker.py`` (the same script developers use), in a
temporary runtime folder, with the real jars fetched by ``make setup``. Every test in this folder
is marked ``integration``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, require_jars
from pipelines.settings import PROJECT_ROOT, Settings, load_settings
from pipelines.spark import get_spark_session

HERE = Path(__file__).resolve().parent
BROKER_SCRIPT = PROJECT_ROOT / "platform" / "kafka" / "broker.py"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs Java and the fetched jars (slow)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder (the hook sees the whole session's items)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@dataclass(frozen=True)
class BrokerCli:
    """Runs ``broker.py`` in a subprocess against a given runtime folder and jars folder."""

    jars_dir: Path

    def env(self, runtime_dir: Path, jars_dir: Path | None = None) -> dict[str, str]:
        """The process environment: no inherited ``CONFLUX_*`` variable but these two."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONFLUX_")}
        env["CONFLUX_RUNTIME_DIR"] = str(runtime_dir)
        env["CONFLUX_JARS_DIR"] = str(jars_dir or self.jars_dir)
        return env

    def run(
        self, *args: str, runtime_dir: Path, jars_dir: Path | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run ``broker.py <args>``; never raises on a non-zero exit code."""
        return subprocess.run(
            [sys.executable, str(BROKER_SCRIPT), *args],
            env=self.env(runtime_dir, jars_dir),
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @staticmethod
    def parse(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        """The JSON document ``broker.py`` printed on stdout; fails the test if there is none."""
        try:
            return dict(json.loads(result.stdout))
        except ValueError:
            pytest.fail(f"broker.py printed no JSON:\n{BrokerCli.describe(result)}")

    @staticmethod
    def describe(result: subprocess.CompletedProcess[str]) -> str:
        """A command's exit code and output, for assertion messages."""
        return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@dataclass(frozen=True)
class KafkaBroker:
    """A running local broker: what tests need to reach it and where its files are."""

    bootstrap_servers: str
    runtime_dir: Path
    pid: int
    state: dict[str, Any] = field(default_factory=dict)


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


def settings_env(settings: Settings) -> dict[str, str]:
    """A subprocess environment that makes ``load_settings()`` return ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONFLUX_")}
    env.update(
        CONFLUX_RUNTIME_DIR=str(settings.runtime_dir),
        CONFLUX_JARS_DIR=str(settings.jars_dir),
        CONFLUX_FLOWS_DIR=str(settings.flows_dir),
        CONFLUX_SPARK_CONF=json.dumps({"spark.ui.enabled": "false", **settings.spark_conf}),
    )
    if settings.kafka_bootstrap_servers:
        env["CONFLUX_KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers
    return env

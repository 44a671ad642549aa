"""Handles on the real local runtime that tests share: the broker CLI, a running broker, and the
environment that points a subprocess at a test runtime folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import PROJECT_ROOT, Settings, settings_environment

BROKER_SCRIPT = PROJECT_ROOT / "platform" / "kafka" / "broker.py"


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


def settings_env(settings: Settings) -> dict[str, str]:
    """A subprocess environment that makes ``load_settings()`` return ``settings``, UI off."""
    ui_off = {"spark.ui.enabled": "false", **settings.spark_conf}
    return settings_environment(replace(settings, spark_conf=ui_off))

"""Resources of the control plane: how Dagster launches stream jobs and gets short Spark sessions."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource
from pydantic import Field

from pipelines import runner
from pipelines.errors import ConfigError
from pipelines.settings import load_settings
from pipelines.spark import spark_conf


class SparkSubmitResource(ConfigurableResource):
    """Builds the ``spark-submit`` command that runs :mod:`pipelines.runner` as its own application.

    The Spark settings are the same ones an embedded session uses (:func:`pipelines.spark.spark_conf`),
    passed as ``--conf``, so pointing ``CONFLUX_SPARK_MASTER`` at a cluster runs the same job there.
    """

    spark_submit: str = Field(
        default="",
        description="Path of spark-submit; empty means the one installed with pyspark beside Python.",
    )
    graceful_stop_seconds: float = Field(
        default=120.0, description="How long a stop waits for the in-flight micro-batch to commit."
    )
    progress_interval_seconds: float = Field(
        default=15.0,
        description="Continuous runs: at most one progress event per flow per this many seconds.",
    )
    heartbeat_seconds: float = Field(default=60.0, description="Continuous runs: heartbeat period.")

    def executable(self) -> str:
        if self.spark_submit:
            return self.spark_submit
        beside_python = Path(sys.executable).parent / "spark-submit"
        found = str(beside_python) if beside_python.exists() else shutil.which("spark-submit")
        if not found:
            raise ConfigError(
                "spark-submit not found: install pyspark (make setup) or set spark_submit"
            )
        return found

    def environment(self) -> dict[str, str]:
        """Variables spark-submit needs: the pip-installed Spark home and this Python."""
        import pyspark

        return {
            "SPARK_HOME": os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent),
            "PYSPARK_PYTHON": sys.executable,
        }

    def command(self, spec_files: list[Path], trigger: str | None, stop_file: Path) -> list[str]:
        settings = load_settings()
        conf = spark_conf(settings)
        command = [self.executable(), "--master", conf.pop("spark.master"), "--name", "conflux"]
        for key, value in sorted(conf.items()):
            command += ["--conf", f"{key}={value}"]
        command.append(str(Path(runner.__file__).resolve()))
        for spec_file in spec_files:
            command += ["--spec", str(spec_file)]
        if trigger:
            command += ["--trigger", trigger]
        return [*command, "--stop-file", str(stop_file)]


def pyspark_resource() -> PySparkResource:
    """dagster-pyspark's resource, configured like every other Conflux session (UI off)."""
    return PySparkResource(spark_config=spark_conf(load_settings(), ui=False))

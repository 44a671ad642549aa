"""Resources of the control plane: how Dagster launches stream jobs and gets short Spark sessions."""

from __future__ import annotations

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from pipelines.launcher import SparkSubmit
from pipelines.settings import load_settings
from pipelines.spark import export_credentials, spark_conf, spark_environment


class SparkSubmitResource(ConfigurableResource):
    """How Dagster runs :mod:`pipelines.runner` as its own application (:mod:`pipelines.launcher`).

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

    def launcher(self) -> SparkSubmit:
        return SparkSubmit(self.spark_submit)


def pyspark_resource() -> LazyPySparkResource:
    """dagster-pyspark's resource, configured like every other Conflux session (UI off). The S3
    store's credentials go into this process's environment, which the session's JVM inherits
    (:func:`pipelines.spark.export_credentials`): never into its Spark settings."""
    settings = load_settings()
    export_credentials(spark_environment(settings))
    return LazyPySparkResource(spark_config=spark_conf(settings, ui=False))

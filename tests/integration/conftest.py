"""Every test in this folder is marked ``integration`` (real Spark, Delta and Kafka).

``store_settings``: the suite's settings with the lake and the checkpoints in a bucket of the
module's own on the module's S3 store (:func:`tests.conftest.s3_store`). The suite's own Spark
session was built before that store existed: it reaches the bucket through per-bucket S3A
settings (``fs.s3a.bucket.<bucket>.*``); applications get the store from the settings like any
Conflux run.
"""

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.settings import Settings
from tests.support.runtime import S3Store

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder (the hook sees the whole session's items)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def store_settings(spark_settings: Settings, s3_store: S3Store, spark: SparkSession) -> Settings:
    """Settings with the lake and the checkpoints on the module's S3 store (see the module doc)."""
    connection = s3_store.connection
    bucket = f"lake-{uuid.uuid4().hex[:8]}"
    connection.client().create_bucket(Bucket=bucket)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in {
        "endpoint": connection.endpoint or "",
        "endpoint.region": connection.region,
        "connection.ssl.enabled": "false",
        "access.key": connection.access_key_id,
        "secret.key": connection.secret_access_key,
    }.items():
        hadoop.set(f"fs.s3a.bucket.{bucket}.{key}", value)
    return replace(
        spark_settings,
        lake_root=f"s3a://{bucket}/lake",
        checkpoints_root=f"s3a://{bucket}/checkpoints",
        s3_endpoint=connection.endpoint,
        s3_region=connection.region,
        s3_access_key_id=connection.access_key_id,
        s3_secret_access_key=connection.secret_access_key,
        spark_conf={"spark.ui.enabled": "false", **spark_settings.spark_conf},
    )

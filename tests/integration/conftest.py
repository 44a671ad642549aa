"""Every test in this folder is marked ``integration`` (real Spark, Delta and Kafka).

``store_settings``: the suite's settings with the lake and the checkpoints in a bucket of the
module's own on the module's S3 store (:func:`tests.conftest.s3_store`), which the suite's own
Spark session reaches through :meth:`tests.support.runtime.S3Store.session_bucket`; applications
get the store from the settings like any Conflux run.
"""

from collections.abc import Iterator
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
def store_settings(
    spark_settings: Settings, s3_store: S3Store, spark: SparkSession
) -> Iterator[Settings]:
    """Settings with the lake and the checkpoints on the module's S3 store (see the module doc)."""
    connection = s3_store.connection
    with s3_store.session_bucket(spark, "lake") as bucket:
        yield replace(
            spark_settings,
            lake_root=f"s3a://{bucket}/lake",
            checkpoints_root=f"s3a://{bucket}/checkpoints",
            s3_endpoint=connection.endpoint,
            s3_region=connection.region,
            s3_access_key_id=connection.access_key_id,
            s3_secret_access_key=connection.secret_access_key,
            spark_conf={"spark.ui.enabled": "false", **spark_settings.spark_conf},
        )

"""The one place a Conflux Spark session is configured.

:func:`spark_conf` computes the settings (Delta's extension and catalog, the locally fetched jars,
small-machine defaults); :func:`get_spark_session` builds a session from them, and the stream
launcher turns the same settings into ``spark-submit --conf`` arguments, so an embedded run and a
cluster run are configured identically. Every key can be overridden through ``Settings.spark_conf``
(``CONFLUX_SPARK_CONF`` or ``conflux.yaml``) and the master through ``CONFLUX_SPARK_MASTER``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from pipelines.jvm import check_java, class_archive_options, require_jars
from pipelines.settings import PROJECT_ROOT, Settings, load_settings

LOG4J_CONFIG = PROJECT_ROOT / "platform" / "spark" / "log4j2.properties"

#: Defaults sized for a 2-core, single-machine run; a cluster overrides them through settings.
SMALL_MACHINE_DEFAULTS: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Delta rebuilds table state after each commit with this many tasks; 50 (its default) costs
    # seconds per micro-batch on two cores.
    "spark.databricks.delta.snapshotPartitions": "2",
}
LOOPBACK_DRIVER: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
#: Stateful queries (gold) keep their state in RocksDB, off the JVM heap, and checkpoint only the
#: changes of each batch (changelog checkpointing) instead of a snapshot of every state store.
#: Recorded in a query's checkpoint at its first start; stateless queries ignore it.
STATE_STORE_CONF: Mapping[str, str] = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_conf(settings: Settings, ui: bool = True) -> dict[str, str]:
    """All Spark settings for a Conflux application, user overrides applied last.

    Raises:
        ConfigError: the jars were not fetched (``make setup``) or Java is missing or too old.
    """
    jars = require_jars(settings.spark_jars_dir, "Spark (Delta + Kafka connector)")
    local = settings.spark_master.startswith("local")
    conf: dict[str, str] = {
        **SMALL_MACHINE_DEFAULTS,
        **STATE_STORE_CONF,
        **DELTA_CONF,
        "spark.master": settings.spark_master,
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.warehouse.dir": str(settings.runtime_dir / "warehouse"),
        "spark.driver.extraJavaOptions": (
            f"-Dderby.system.home={settings.runtime_dir / 'derby'} "
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG} "
            # the archive matches this machine's pyspark classpath: embedded (local) drivers only
            f"{class_archive_options(settings.jars_dir) if local else ''}"
        ).strip(),
        "spark.ui.enabled": "true" if ui else "false",
        "spark.pyspark.python": sys.executable,
    }
    if local:
        conf.update(LOOPBACK_DRIVER)  # embedded runs listen on loopback only
    conf.update(settings.spark_conf)
    return conf


def get_spark_session(
    app_name: str = "conflux", settings: Settings | None = None, ui: bool = True
) -> SparkSession:
    """A SparkSession with Delta and the Kafka connector, configured from ``settings``.

    Re-uses the active session if there is one (its settings then stay as they were).
    """
    settings = settings or load_settings()
    conf = spark_conf(settings, ui=ui)
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()

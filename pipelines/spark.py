"""The one place a Conflux Spark session is configured.

:func:`spark_conf` computes the settings (Delta's extension and catalog, the locally fetched jars,
small-machine defaults); :func:`get_spark_session` builds a session from them, and the stream
launcher turns the same settings into ``spark-submit --conf`` arguments, so an embedded run and a
cluster run are configured identically. Every key can be overridden through ``Settings.spark_conf``
(``CONFLUX_SPARK_CONF`` or ``conflux.yaml``) and the master through ``CONFLUX_SPARK_MASTER``.

``s3a://`` locations: every session carries Hadoop's S3A connector and Conflux's storage classes
(``make jars``), whose Delta log store and checkpoint file manager create files on S3 with one
conditional PUT, so a zombie driver cannot overwrite a commit (docs/object-storage.md). The
store's endpoint and region are Spark settings; its credentials never are:
:func:`spark_environment` gives them as the ``AWS_*`` variables S3A reads from the driver's
environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from pipelines.code_archive import ship_code
from pipelines.errors import ConfigError
from pipelines.jvm import (
    CHECKPOINT_MANAGER_CLASS,
    LOG_STORE_CLASS,
    check_java,
    class_archive_options,
    require_jars,
    storage_jars,
)
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
#: On the project's cluster (a master on loopback, ``platform/spark/cluster.py``): one executor of
#: one core on each worker, two cores at most per application, so a flow and a maintenance job or
#: backfill run side by side on its two 2-core workers. Another cluster keeps Spark's defaults.
CLUSTER_DEFAULTS: Mapping[str, str] = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "1g",
    "spark.cores.max": "2",
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
#: Spark compiles the Java code it generates for a query's operators once per distinct source
#: and keeps up to ``cache.maxEntries`` classes (default 100). One silver batch of a Debezium flow
#: with current and history tables plans ~60 jobs whose code is ~300 classes, so with the default
#: every batch evicted the last one's and compiled all ~300 again: ~3 s of a 9-11 s batch on two
#: cores (bench/HISTORY.md, "Generated code compiled again every batch"). With room for a few
#: flows' batches, a steady batch compiles ~5 (code that differs between batches; not traced). Each
#: compiled class stays in the JVM's metaspace (tens of KB): 2,000 of them is ~100 MB at most.
CODEGEN_CONF: Mapping[str, str] = {"spark.sql.codegen.cache.maxEntries": "2000"}
DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

#: Commits on S3 by conditional PUT (the classes of platform/jvm/storage), s3:// read as s3a://,
#: and path-style addressing (an S3-compatible server has no per-bucket host names).
S3A_CONF: Mapping[str, str] = {
    "spark.delta.logStore.s3a.impl": LOG_STORE_CLASS,
    "spark.delta.logStore.s3.impl": LOG_STORE_CLASS,
    # global to the session: the manager hands every other scheme to Spark's own
    "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_MANAGER_CLASS,
    "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
}


def uses_s3(settings: Settings) -> bool:
    """Whether the settings name an S3 store (an endpoint, or credentials for AWS's own)."""
    return bool(settings.s3_endpoint) or settings.s3_connection() is not None


def s3a_conf(settings: Settings) -> dict[str, str]:
    """S3A and the conditional commit classes; the store's endpoint and region when set."""
    conf = dict(S3A_CONF)
    if settings.s3_endpoint:
        scheme = urlparse(settings.s3_endpoint).scheme.lower()
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.s3_endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(scheme != "http").lower()
    if settings.s3_endpoint or settings.s3_region != Settings.s3_region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = settings.s3_region
    return conf


def spark_environment(settings: Settings) -> dict[str, str]:
    """The S3 store's credentials as the variables S3A's default credential chain reads
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``), for the environment of a
    driver: never in Spark settings, which show on the Spark UI, in logs and on command lines.
    Empty when the settings have no credentials."""
    connection = settings.s3_connection()
    if connection is None:
        return {}
    return {
        "AWS_ACCESS_KEY_ID": connection.access_key_id,
        "AWS_SECRET_ACCESS_KEY": connection.secret_access_key,
        "AWS_REGION": connection.region,
    }


def spark_conf(settings: Settings, ui: bool = True) -> dict[str, str]:
    """All Spark settings for a Conflux application, user overrides applied last.

    Raises:
        ConfigError: the jars were not fetched (``make setup``) or Java is missing or too old.
    """
    jars = require_jars(settings.spark_jars_dir, "Spark (Delta + Kafka connector)")
    # always when fetched, not only for S3 settings: one session serves local and S3 paths alike
    s3_jars = storage_jars(settings.jars_dir, required=uses_s3(settings))
    local = not settings.on_cluster
    on_loopback = urlparse(settings.spark_master).hostname in LOOPBACK_HOSTS
    conf: dict[str, str] = {
        **SMALL_MACHINE_DEFAULTS,
        **STATE_STORE_CONF,
        **CODEGEN_CONF,
        **DELTA_CONF,
        **(CLUSTER_DEFAULTS if on_loopback else {}),
        **jar_conf([*jars, *s3_jars], local),
        "spark.master": settings.spark_master,
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
    if local or on_loopback:
        conf.update(LOOPBACK_DRIVER)  # embedded runs (and a cluster on this host): loopback only
    if s3_jars:
        conf.update(s3a_conf(settings))
    refuse_unsafe_overrides(settings.spark_conf)
    conf.update(settings.spark_conf)
    return conf


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def jar_conf(jars: Sequence[Path], local: bool) -> dict[str, str]:
    """How the jars reach the JVMs: ``spark.jars`` for an embedded run; on a cluster the jar
    folders on the driver's and executors' class paths, since ``spark.jars`` would copy every
    jar into each application's folder on every worker, once per application (and never clean
    it unless the worker is told to). Every host of a cluster therefore has the jars at the
    same path (``make jars``, or the image)."""
    if local:
        return {"spark.jars": ",".join(str(j) for j in jars)}
    classpath = ":".join(sorted({str(jar.parent / "*") for jar in jars}))
    return {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
    }


#: Settings one writer per flow rests on (docs/object-storage.md); ``spark_conf`` may not change
#: them, since a plain PUT in any of these places could overwrite another driver's commit.
SAFETY_KEYS = (
    "spark.delta.logStore.s3a.impl",
    "spark.delta.logStore.s3.impl",
    "spark.sql.streaming.checkpointFileManagerClass",
    "spark.hadoop.fs.s3a.create.conditional.enabled",
)


def refuse_unsafe_overrides(overrides: Mapping[str, str]) -> None:
    """Fail naming the key if user settings change how commits are made on S3.

    Raises:
        ConfigError: a safety key (or a per-bucket ``fs.s3a.bucket.*.create.conditional.enabled``)
            set to anything but Conflux's own value.
    """
    for key, value in overrides.items():
        per_bucket = key.startswith("spark.hadoop.fs.s3a.bucket.") and key.endswith(
            ".create.conditional.enabled"
        )
        wanted = S3A_CONF.get(key, "true" if per_bucket else None)
        if (key in SAFETY_KEYS or per_bucket) and value != wanted:
            raise ConfigError(
                f"spark_conf: {key}={value} would let a commit on S3 overwrite another driver's "
                f"(Conflux sets {wanted}; docs/object-storage.md): remove it from spark_conf"
            )


def get_spark_session(
    app_name: str = "conflux", settings: Settings | None = None, ui: bool = True
) -> SparkSession:
    """A SparkSession with Delta and the Kafka connector, configured from ``settings``.

    Re-uses the active session if there is one (its settings then stay as they were). The S3
    store's credentials (:func:`spark_environment`) go into this process's environment, which the
    driver's JVM inherits, unless credentials are already there.
    """
    settings = settings or load_settings()
    conf = spark_conf(settings, ui=ui)
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    export_credentials(spark_environment(settings))
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return prepare_session(builder.getOrCreate(), settings)


def prepare_session(spark: SparkSession, settings: Settings) -> SparkSession:
    """What a session on a cluster needs once it runs (nothing in local mode): the project's
    code shipped to the executors (:mod:`pipelines.code_archive`).

    The S3 credentials need nothing here: Spark copies the driver's ``AWS_*`` variables into the
    Hadoop settings that travel with every task (``fs.s3a.access.key`` …), so executors on other
    hosts write with the driver's credentials and the credentials never become Spark settings.
    """
    if settings.on_cluster:
        ship_code(spark, settings)
    return spark


def export_credentials(
    env: Mapping[str, str], environ: MutableMapping[str, str] | None = None
) -> None:
    """Put ``env`` (:func:`spark_environment`) into ``environ`` (default: ``os.environ``) unless
    that already names AWS credentials: a key pair is taken whole or not at all, never mixed."""
    target = os.environ if environ is None else environ
    if not env or "AWS_ACCESS_KEY_ID" in target or "AWS_SECRET_ACCESS_KEY" in target:
        return
    for key, value in env.items():
        target.setdefault(key, value)

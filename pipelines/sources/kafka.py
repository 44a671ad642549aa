"""Kafka source: subscribe to topics (or a pattern) and keep every record as raw bytes.

Bronze never parses: ``key`` and ``value`` stay ``binary`` exactly as the broker returned them, so
non-UTF-8 bytes, truncated JSON, empty payloads and null keys all land unchanged and parsing errors
belong to silver. Each row carries its coordinates (topic, partition, offset, timestamp), which are
unique per record and let anyone check exactly-once delivery.

Options under ``kafka.*`` pass through to the Kafka client. A value written ``${env:NAME}`` is read
from the environment when the stream starts, so SASL/SSL secrets live outside the spec; such values
are never logged (see :func:`redacted`).

Lost offsets: when the offsets a checkpoint points at no longer exist (retention deleted them
before they were read, or the topic was deleted and recreated), ``fail_on_data_loss: true`` (the
default) fails the query with Spark's data-loss error and the runner exits non-zero, so nothing is
skipped silently. ``false`` logs Spark's warning and goes on: records deleted by retention are
skipped, and in a recreated topic the records below the checkpoint's offsets are skipped too (the
query keeps its position). Tested in ``tests/integration/test_runner.py::TestLostOffsets``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.errors import ConfigError
from pipelines.settings import Settings
from pipelines.spec import KafkaSource

_ENV_REF = re.compile(r"^\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}$")
_SECRET_HINTS = ("password", "jaas", "secret", "token", "key")

#: Columns bronze keeps from a Kafka record, in order.
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "kafka_timestamp", "headers")


def resolve_options(
    options: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Replace ``${env:NAME}`` values with the variable's value; a missing variable is an error."""
    env = os.environ if environ is None else environ
    resolved = {}
    for key, value in options.items():
        match = _ENV_REF.match(value)
        if match:
            name = match.group(1)
            if name not in env:
                raise ConfigError(
                    f"source.options.{key} refers to ${{env:{name}}}, which is not set"
                )
            value = env[name]
        resolved[key] = value
    return resolved


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """Options safe to log: values of secret-looking keys are replaced by ``***``."""
    return {
        k: "***" if any(hint in k.lower() for hint in _SECRET_HINTS) else v
        for k, v in options.items()
    }


def reader_options(source: KafkaSource, settings: Settings) -> dict[str, str]:
    """The options given to Spark's Kafka source (secrets resolved: do not log the result)."""
    options = {
        "kafka.bootstrap.servers": source.bootstrap_servers
        or settings.resolved_bootstrap_servers(),
        "failOnDataLoss": str(source.fail_on_data_loss).lower(),
        "includeHeaders": "true",
    }
    if source.pattern:
        options["subscribePattern"] = source.pattern
    else:
        options["subscribe"] = ",".join(source.topics)
    if source.starting_offsets == "timestamp":
        options["startingTimestamp"] = str(source.starting_timestamp_ms)
    else:
        options["startingOffsets"] = source.starting_offsets
    if source.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(source.max_offsets_per_trigger)
    options.update(resolve_options(source.options))
    return options


def bronze_columns() -> list[Column]:
    return [
        F.col("key"),
        F.col("value"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("headers"),
    ]


def read_kafka_stream(spark: SparkSession, source: KafkaSource, settings: Settings) -> DataFrame:
    """A streaming DataFrame of raw Kafka records with their coordinates."""
    stream = spark.readStream.format("kafka").options(**reader_options(source, settings)).load()
    return stream.select(*bronze_columns())


#: librdkafka's own log lines are not the operator's story: the probe's result says it all.
_QUIET_CLIENT = logging.getLogger("conflux.kafka_probe")
_QUIET_CLIENT.setLevel(logging.CRITICAL)


def broker_unreachable(source: KafkaSource, settings: Settings, timeout: float = 5.0) -> str | None:
    """Why the source's brokers cannot be reached now, or None when they answer: an admin client
    asks them for the cluster's metadata, as Spark's Kafka source will when the flow starts.

    Only the address and ``kafka.security.protocol`` are passed on (a Java client's other options
    do not translate to librdkafka's); a broker refusing the probe's authentication still
    answered, so it counts as reachable and the flow's own client reports the refusal.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        servers = source.bootstrap_servers or settings.resolved_bootstrap_servers()
    except ConfigError as exc:  # the local broker is stopped: its state file is gone
        return str(exc)
    config: dict[str, str | int | float | bool] = {"bootstrap.servers": servers}
    protocol = source.options.get("kafka.security.protocol")
    if protocol:
        config["security.protocol"] = protocol
    answered = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
    try:
        AdminClient(config, logger=_QUIET_CLIENT).list_topics(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        if isinstance(error, KafkaError) and error.code() in answered:
            return None
        detail = error.str() if isinstance(error, KafkaError) else str(error)
        return f"brokers {servers} did not answer within {timeout:.0f} s: {detail}"
    return None

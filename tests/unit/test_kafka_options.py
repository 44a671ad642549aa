import re

import pytest

from pipelines.errors import ConfigError
from pipelines.progress import kafka_lag
from pipelines.settings import load_settings
from pipelines.sources.kafka import reader_options, redacted, resolve_options
from pipelines.spec import parse_spec


def test_env_references_are_resolved_and_secrets_redacted() -> None:
    options = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.jaas.config": "${env:ORDERS_JAAS}",
    }
    resolved = resolve_options(options, environ={"ORDERS_JAAS": "secret-jaas"})
    assert resolved["kafka.sasl.jaas.config"] == "secret-jaas"
    assert redacted(resolved) == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.jaas.config": "***",
    }


def test_missing_secret_variable_is_named() -> None:
    with pytest.raises(ConfigError, match=r"\$\{env:NOPE\}, which is not set"):
        resolve_options({"kafka.sasl.jaas.config": "${env:NOPE}"}, environ={})


def test_reader_options_from_spec() -> None:
    spec = parse_spec(
        {
            "name": "orders",
            "source": {
                "kind": "kafka",
                "pattern": "orders\\..*",
                "starting_offsets": "timestamp",
                "starting_timestamp_ms": 1700000000000,
                "max_offsets_per_trigger": 500,
                "fail_on_data_loss": False,
                "bootstrap_servers": "127.0.0.1:9092",
            },
            "target": {"table": "t"},
        }
    )
    options = reader_options(spec.source, load_settings(environ={}))  # type: ignore[arg-type]
    assert options["subscribePattern"] == "orders\\..*"
    assert options["startingTimestamp"] == "1700000000000"
    assert options["maxOffsetsPerTrigger"] == "500"
    assert options["failOnDataLoss"] == "false"
    assert "subscribe" not in options and "startingOffsets" not in options


def test_lag_sums_partitions() -> None:
    end = {"orders": {"0": 10, "1": 5}}
    latest = {"orders": {"0": 15, "1": 5, "2": 3}}
    assert kafka_lag(end, latest) == 8
    assert kafka_lag(None, latest) is None


def test_launch_command_is_logged_without_secrets() -> None:
    from assets.launch import loggable

    command = [
        "spark-submit",
        "--conf",
        "spark.hadoop.fs.s3a.secret.key=abc",
        "--conf",
        "spark.master=local",
    ]
    assert loggable(command) == [
        "spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=***", "--conf", "spark.master=local",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"kafka.default.api.timeout.ms": "10000"}, "below kafka.request.timeout.ms = 30000 (the"),
        (
            {"kafka.default.api.timeout.ms": "3000", "kafka.request.timeout.ms": "5000"},
            "set kafka.request.timeout.ms to at most 3000 too",
        ),
        ({"kafka.default.api.timeout.ms": "ten"}, "whole milliseconds"),
    ],
)
def test_client_timeouts_the_kafka_client_refuses_are_refused_in_the_spec(
    options: dict[str, str], problem: str
) -> None:
    """Else Spark's Kafka source fails at its start with a ConfigException, which reads as a
    source error and is restarted in vain."""
    data = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"], "options": options},
        "target": {"table": "t"},
    }
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_spec(data)
    fine = {"kafka.default.api.timeout.ms": "3000", "kafka.request.timeout.ms": "3000"}
    parse_spec({**data, "source": {**data["source"], "options": fine}})

from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.settings import PROJECT_ROOT, load_settings, settings_environment


def test_defaults_are_the_embedded_runtime() -> None:
    settings = load_settings(environ={})
    assert settings.runtime_dir == PROJECT_ROOT / ".runtime"
    assert settings.spark_jars_dir == PROJECT_ROOT / ".runtime" / "jars" / "spark"
    assert settings.spark_master == "local[*]"


def test_environment_overrides_and_jars_follow_the_runtime_dir(tmp_path: Path) -> None:
    settings = load_settings(
        environ={
            "CONFLUX_RUNTIME_DIR": str(tmp_path),
            "CONFLUX_SPARK_MASTER": "spark://cluster:7077",
            "CONFLUX_SPARK_CONF": '{"spark.sql.shuffle.partitions": "64"}',
        }
    )
    assert settings.runtime_dir == tmp_path
    assert settings.jars_dir == tmp_path / "jars"
    assert settings.spark_master == "spark://cluster:7077"
    assert settings.spark_conf == {"spark.sql.shuffle.partitions": "64"}


def test_unknown_environment_variable_fails_fast() -> None:
    with pytest.raises(ConfigError, match="CONFLUX_SPARK_MASTR"):
        load_settings(environ={"CONFLUX_SPARK_MASTR": "local[2]"})


def test_unknown_key_in_config_file_names_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "conflux.yaml"
    config.write_text("spark_master: local[2]\nspark_memory: 4g\n")
    with pytest.raises(ConfigError, match=r"conflux.yaml: unknown setting\(s\) spark_memory"):
        load_settings(environ={}, config_file=config)


def test_config_file_then_environment(tmp_path: Path) -> None:
    config = tmp_path / "conflux.yaml"
    config.write_text("spark_master: local[2]\nspark_conf: {spark.driver.memory: 1g}\n")
    settings = load_settings(
        environ={"CONFLUX_CONFIG": str(config), "CONFLUX_SPARK_MASTER": "local[1]"}
    )
    assert settings.spark_master == "local[1]"
    assert settings.spark_conf == {"spark.driver.memory": "1g"}


def test_spark_conf_must_be_spark_keys() -> None:
    with pytest.raises(ConfigError, match=r"must start with 'spark\.'"):
        load_settings(environ={"CONFLUX_SPARK_CONF": '{"driver.memory": "1g"}'})


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(environ={"CONFLUX_CONFIG": str(tmp_path / "nope.yaml")})


def test_bootstrap_without_broker_says_how_to_start_it(tmp_path: Path) -> None:
    settings = load_settings(environ={"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="make broker-start"):
        settings.resolved_bootstrap_servers()


def test_settings_environment_round_trips(tmp_path: Path) -> None:
    settings = load_settings(
        environ={
            "CONFLUX_RUNTIME_DIR": str(tmp_path),
            "CONFLUX_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
            "CONFLUX_SPARK_CONF": '{"spark.sql.shuffle.partitions": "2"}',
            "CONFLUX_LEASE_SECONDS": "12.5",
        }
    )
    assert settings.lease_seconds == 12.5
    env = settings_environment(settings, base={"PATH": "/bin", "CONFLUX_OLD": "x"})
    assert env["PATH"] == "/bin" and "CONFLUX_OLD" not in env
    assert load_settings(environ=env) == settings


@pytest.mark.parametrize("value", ["abc", "1", "-5"])
def test_a_lease_shorter_than_three_seconds_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="lease_seconds must be a number of seconds >= 3"):
        load_settings(
            environ={"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_LEASE_SECONDS": value}
        )

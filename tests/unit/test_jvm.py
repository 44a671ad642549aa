from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.jvm import check_java, parse_java_major, require_jars
from pipelines.settings import load_settings
from pipelines.spark import spark_conf


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_412"', 8),
        ('openjdk version "21" 2023-09-19', 21),
    ],
)
def test_parse_java_major(output: str, major: int) -> None:
    assert parse_java_major(output) == major


def test_old_java_is_refused_with_the_fix(tmp_path: Path) -> None:
    fake_java = tmp_path / "java"
    fake_java.write_text("#!/bin/sh\necho 'java version \"1.8.0_412\"' >&2\n")
    fake_java.chmod(0o755)
    with pytest.raises(ConfigError, match="Java 8; Conflux needs Java 17"):
        check_java(str(fake_java))


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="Java is not installed"):
        check_java()


def test_missing_jars_say_run_make_setup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run `make setup`"):
        require_jars(tmp_path / "spark", "Spark")
    settings = load_settings(environ={"CONFLUX_JARS_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="make setup"):
        spark_conf(settings)


def test_spark_conf_has_delta_jars_and_user_overrides_win(tmp_path: Path) -> None:
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "delta-spark_4.1_2.13-4.4.0.jar").write_bytes(b"")
    settings = load_settings(
        environ={
            "CONFLUX_JARS_DIR": str(tmp_path),
            "CONFLUX_SPARK_CONF": '{"spark.sql.shuffle.partitions": "32"}',
        }
    )
    conf = spark_conf(settings, ui=False)
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.jars"].endswith("delta-spark_4.1_2.13-4.4.0.jar")
    assert conf["spark.sql.shuffle.partitions"] == "32"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"


def test_cluster_master_does_not_pin_the_driver_to_loopback(tmp_path: Path) -> None:
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "x-1.0.jar").write_bytes(b"")
    settings = load_settings(
        environ={"CONFLUX_JARS_DIR": str(tmp_path), "CONFLUX_SPARK_MASTER": "yarn"}
    )
    conf = spark_conf(settings)
    assert conf["spark.master"] == "yarn"
    assert "spark.driver.bindAddress" not in conf

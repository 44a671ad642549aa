"""The Spark side of S3 (no JVM): the S3A jars and Conflux's storage classes on every session's
class path, the conditional commit classes named, the store's endpoint in Spark settings and its
credentials only in the driver's environment; the storage classes' build needs a JDK."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipelines.errors import ConfigError
from pipelines.jvm import CHECKPOINT_MANAGER_CLASS, LOG_STORE_CLASS, S3A_JARS, STORAGE_JAR
from pipelines.settings import PROJECT_ROOT, load_settings
from pipelines.spark import export_credentials, spark_conf, spark_environment

SECRET = "s3cr3t-Never-Shown"
KEY_ID = "conflux-key-id"


def jars_folder(tmp_path: Path, s3a: bool = True, storage: bool = True) -> Path:
    """A jars folder with a Delta jar, and the S3A set and the storage jar if asked."""
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "delta-spark_4.1_2.13-4.4.0.jar").write_bytes(b"")
    if s3a:
        (tmp_path / S3A_JARS).mkdir()
        (tmp_path / S3A_JARS / "hadoop-aws-3.4.2.jar").write_bytes(b"")
    if storage:
        (tmp_path / STORAGE_JAR).parent.mkdir()
        (tmp_path / STORAGE_JAR).write_bytes(b"")
    return tmp_path


def s3_environ(jars: Path, endpoint: str = "http://127.0.0.1:9000") -> dict[str, str]:
    return {
        "CONFLUX_JARS_DIR": str(jars),
        "CONFLUX_S3_ENDPOINT": endpoint,
        "CONFLUX_S3_REGION": "eu-west-3",
        "CONFLUX_S3_ACCESS_KEY_ID": KEY_ID,
        "CONFLUX_S3_SECRET_ACCESS_KEY": SECRET,
    }


def test_every_session_carries_the_s3a_jars_and_the_conditional_commit_classes(
    tmp_path: Path,
) -> None:
    jars = jars_folder(tmp_path)
    conf = spark_conf(load_settings(environ={"CONFLUX_JARS_DIR": str(jars)}))  # no S3 settings
    assert conf["spark.jars"].split(",") == [
        str(jars / "spark" / "delta-spark_4.1_2.13-4.4.0.jar"),
        str(jars / S3A_JARS / "hadoop-aws-3.4.2.jar"),
        str(jars / STORAGE_JAR),
    ]
    assert conf["spark.delta.logStore.s3a.impl"] == LOG_STORE_CLASS
    assert conf["spark.delta.logStore.s3.impl"] == LOG_STORE_CLASS
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == CHECKPOINT_MANAGER_CLASS
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.create.conditional.enabled"] == "true"
    assert "spark.hadoop.fs.s3a.endpoint" not in conf  # AWS's own unless an endpoint is set
    assert "spark.hadoop.fs.s3a.endpoint.region" not in conf


def test_the_store_endpoint_is_a_spark_setting_and_its_secret_never_is(tmp_path: Path) -> None:
    settings = load_settings(environ=s3_environ(jars_folder(tmp_path)))
    conf = spark_conf(settings)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    leaked = {k: v for k, v in conf.items() if SECRET in v or KEY_ID in v or SECRET in k}
    assert leaked == {}
    assert not any("access.key" in k or "secret" in k.lower() for k in conf)
    assert spark_environment(settings) == {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "eu-west-3",
    }


def test_an_https_endpoint_keeps_tls(tmp_path: Path) -> None:
    environ = s3_environ(jars_folder(tmp_path), endpoint="https://s3.example.com")
    conf = spark_conf(load_settings(environ=environ))
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_user_overrides_still_win(tmp_path: Path) -> None:
    environ = {
        **s3_environ(jars_folder(tmp_path)),
        "CONFLUX_SPARK_CONF": '{"spark.hadoop.fs.s3a.path.style.access": "false"}',
    }
    assert spark_conf(load_settings(environ=environ))["spark.hadoop.fs.s3a.path.style.access"] == (
        "false"
    )


def test_no_credentials_no_environment(tmp_path: Path) -> None:
    assert spark_environment(load_settings(environ={"CONFLUX_JARS_DIR": str(tmp_path)})) == {}


def test_a_jars_folder_fetched_before_s3_gives_a_local_only_session(tmp_path: Path) -> None:
    jars = jars_folder(tmp_path, s3a=False, storage=False)
    conf = spark_conf(load_settings(environ={"CONFLUX_JARS_DIR": str(jars)}))
    assert conf["spark.jars"] == str(jars / "spark" / "delta-spark_4.1_2.13-4.4.0.jar")
    assert not any("s3" in key or "checkpointFileManager" in key for key in conf)


@pytest.mark.parametrize(
    ("s3a", "storage", "s3_settings"),
    [
        (False, False, True),  # S3 settings but nothing fetched
        (True, False, False),  # S3A without the conditional commit classes: unsafe, refused
        (False, True, False),
    ],
)
def test_incomplete_s3_jars_say_run_make_jars(
    tmp_path: Path, s3a: bool, storage: bool, s3_settings: bool
) -> None:
    jars = jars_folder(tmp_path, s3a=s3a, storage=storage)
    environ = s3_environ(jars) if s3_settings else {"CONFLUX_JARS_DIR": str(jars)}
    with pytest.raises(ConfigError, match="run `make jars`"):
        spark_conf(load_settings(environ=environ))


def test_credentials_go_into_the_environment_whole_and_never_over_others() -> None:
    credentials = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_REGION": "r"}
    empty: dict[str, str] = {"PATH": "/bin"}
    export_credentials(credentials, empty)
    assert empty == {"PATH": "/bin", **credentials}
    theirs = {"AWS_ACCESS_KEY_ID": "theirs"}
    export_credentials(credentials, theirs)
    assert theirs == {"AWS_ACCESS_KEY_ID": "theirs"}  # never a key of one pair, secret of another
    region_set = {"AWS_REGION": "mine"}
    export_credentials(credentials, region_set)
    assert region_set == {
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "AWS_REGION": "mine",
    }


def build_storage() -> ModuleType:
    """``platform/jvm/build_storage.py`` (a script: ``platform`` is not a package)."""
    path = PROJECT_ROOT / "platform" / "jvm" / "build_storage.py"
    spec = importlib.util.spec_from_file_location("build_storage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_storage", module)
    spec.loader.exec_module(module)
    return module


def test_a_missing_javac_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    module = build_storage()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="openjdk-17-jdk-headless"):
        module.javac_executable()


def test_the_build_key_follows_the_sources_and_the_classpath(tmp_path: Path) -> None:
    module = build_storage()
    sources = module.java_sources()
    assert {p.name for p in sources} >= {
        "ConditionalS3ALogStore.java",
        "ConditionalCheckpointFileManager.java",
    }
    classpath = [tmp_path / "a-1.0.jar"]
    key = module.build_key(sources, classpath)
    assert module.build_key(sources, classpath) == key
    assert module.build_key(sources, [tmp_path / "a-2.0.jar"]) != key
    assert module.build_key(sources[:-1], classpath) != key

"""The profile switch and what a cluster changes, without a JVM: the settings a profile fills in,
the Spark settings of a cluster run, the refusal of driver-local locations, the shipped code and
the workers' view of the runtime folder."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from pipelines.catalog.tables import check_locations
from pipelines.code_archive import code_archive
from pipelines.errors import ConfigError
from pipelines.executors import executors_report
from pipelines.profiles import Profile
from pipelines.settings import load_settings, settings_environment
from pipelines.spark import spark_conf
from pipelines.spec import SpecError, parse_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "platform" / "spark"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "platform" / "services"))

from cluster import ClusterPaths, namespace_script  # platform/spark/cluster.py


def started_services(runtime: Path) -> None:
    """What the cluster and the S3 store save at their first start."""
    (runtime / "spark-cluster").mkdir(parents=True)
    (runtime / "spark-cluster" / "cluster.json").write_text(
        '{"master_url": "spark://127.0.0.1:7177", "master_pid": 1}'
    )
    (runtime / "s3").mkdir()
    (runtime / "s3" / "credentials.json").write_text(
        json.dumps({"access_key_id": "k", "secret_access_key": "s", "port": 9000})
    )


def test_the_cluster_profile_fills_master_roots_and_store_from_the_services(
    tmp_path: Path,
) -> None:
    started_services(tmp_path)
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_PROFILE": "cluster"})
    assert settings.profile is Profile.CLUSTER
    assert settings.spark_master == "spark://127.0.0.1:7177" and settings.on_cluster
    assert (settings.lake.uri, settings.checkpoints.uri) == (
        "s3a://conflux/lake",
        "s3a://conflux/checkpoints",
    )
    assert (settings.s3_endpoint, settings.s3_access_key_id) == ("http://127.0.0.1:9000", "k")
    assert settings.dagster_home == tmp_path / "dagster-cluster"
    assert load_settings(settings_environment(settings, base={})) == settings


def test_what_the_user_sets_wins_over_the_profile(tmp_path: Path) -> None:
    started_services(tmp_path)
    settings = load_settings(
        {
            "CONFLUX_RUNTIME_DIR": str(tmp_path),
            "CONFLUX_PROFILE": "cluster",
            "CONFLUX_SPARK_MASTER": "spark://spark.example:7077",
            "CONFLUX_LAKE_ROOT": "s3a://lake/prod",
            "CONFLUX_CHECKPOINTS_ROOT": "s3a://lake/checkpoints",
            "CONFLUX_S3_ENDPOINT": "https://s3.example",
            "CONFLUX_S3_ACCESS_KEY_ID": "mine",
            "CONFLUX_S3_SECRET_ACCESS_KEY": "secret",
        }
    )
    assert settings.spark_master == "spark://spark.example:7077"
    assert settings.lake.uri == "s3a://lake/prod"
    assert settings.checkpoints.uri == "s3a://lake/checkpoints"
    assert (settings.s3_endpoint, settings.s3_access_key_id) == ("https://s3.example", "mine")


def test_the_profile_never_puts_its_bucket_on_the_users_store(tmp_path: Path) -> None:
    started_services(tmp_path)
    env = {
        "CONFLUX_RUNTIME_DIR": str(tmp_path),
        "CONFLUX_PROFILE": "cluster",
        "CONFLUX_S3_ACCESS_KEY_ID": "aws-key",
        "CONFLUX_S3_SECRET_ACCESS_KEY": "aws-secret",
    }
    with pytest.raises(ConfigError, match="set CONFLUX_LAKE_ROOT and CONFLUX_CHECKPOINTS_ROOT"):
        load_settings(env)


def test_the_local_profile_changes_nothing(tmp_path: Path) -> None:
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    assert settings.profile is Profile.LOCAL and not settings.on_cluster
    assert settings.dagster_home == tmp_path / "dagster"


@pytest.mark.parametrize(
    ("missing", "fix"),
    [
        ("spark-cluster/cluster.json", "not running.*make cluster-start"),
        ("s3/credentials.json", "never started.*make s3-start"),
    ],
)
def test_a_cluster_profile_without_its_services_names_the_fix(
    tmp_path: Path, missing: str, fix: str
) -> None:
    started_services(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(ConfigError, match=rf"^profile cluster: .*{fix}"):
        load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_PROFILE": "cluster"})


def test_an_unknown_profile_lists_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="profile 'k8s' is not one of local, cluster"):
        load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_PROFILE": "k8s"})


def jars(tmp_path: Path) -> Path:
    for folder, name in (
        ("spark", "delta-spark_4.1_2.13-4.4.0.jar"),
        ("s3a", "hadoop-aws.jar"),
        ("conflux", "conflux-storage.jar"),
    ):
        (tmp_path / "jars" / folder).mkdir(parents=True)
        (tmp_path / "jars" / folder / name).write_bytes(b"")
    return tmp_path / "jars"


def test_on_a_cluster_the_jars_go_on_the_class_path_not_into_every_application(
    tmp_path: Path,
) -> None:
    env = {"CONFLUX_JARS_DIR": str(jars(tmp_path)), "CONFLUX_SPARK_MASTER": "spark://10.0.0.5:7077"}
    conf = spark_conf(load_settings(env))
    assert "spark.jars" not in conf
    expected = f"{tmp_path}/jars/conflux/*:{tmp_path}/jars/s3a/*:{tmp_path}/jars/spark/*"
    assert conf["spark.driver.extraClassPath"] == conf["spark.executor.extraClassPath"] == expected
    assert "spark.driver.host" not in conf  # a remote cluster must reach the driver
    assert "spark.cores.max" not in conf  # another cluster is sized by its owner
    local = spark_conf(load_settings({**env, "CONFLUX_SPARK_MASTER": "spark://127.0.0.1:7077"}))
    assert local["spark.driver.host"] == "127.0.0.1"
    assert local["spark.cores.max"] == "2" and local["spark.executor.cores"] == "1"


def kafka_spec(name: str = "orders", path: str | None = None) -> dict:
    target = {"table": f"bronze_{name}", **({"path": path} if path else {})}
    return {"name": name, "source": {"kind": "kafka", "topics": ["t"]}, "target": target}


def cluster_settings(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    started_services(tmp_path)
    return load_settings(
        {"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_PROFILE": "cluster", **env}
    )


def test_a_table_on_the_drivers_disk_is_refused_on_a_cluster(tmp_path: Path) -> None:
    settings = cluster_settings(tmp_path)
    check_locations([parse_spec(kafka_spec(), where="flows/orders.yaml")], settings)
    local = parse_spec(kafka_spec(path="/data/orders"), where="flows/orders.yaml")
    with pytest.raises(
        SpecError,
        match=r"^flows/orders.yaml: target.path: the bronze table's location /data/orders "
        r"is a local path, but Spark runs on a cluster .*give it an s3a:// path there",
    ):
        check_locations([local], settings)


def test_local_checkpoints_and_landing_folders_are_refused_on_a_cluster(tmp_path: Path) -> None:
    settings = cluster_settings(tmp_path, CONFLUX_CHECKPOINTS_ROOT=str(tmp_path / "checkpoints"))
    with pytest.raises(
        ConfigError, match=r"checkpoints_root: .* is a local path.*CONFLUX_CHECKPOINTS"
    ):
        check_locations([parse_spec(kafka_spec(), where="flows/orders.yaml")], settings)
    files = {
        "name": "landed",
        "source": {"kind": "files", "path": "landing/x"},
        "target": {"table": "bronze_landed"},
    }
    with pytest.raises(SpecError, match=r"source\.path: landing/x is a local landing folder"):
        check_locations([parse_spec(files, where="flows/l.yaml")], cluster_settings(tmp_path / "b"))


def test_the_shipped_code_holds_the_data_plane_and_is_named_by_its_content(
    tmp_path: Path,
) -> None:
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    archive = code_archive(settings)
    assert archive == code_archive(settings)  # the same code: the same file, not rewritten
    names = zipfile.ZipFile(archive).namelist()
    assert {"pipelines/__init__.py", "pipelines/runner.py", "quality/__init__.py"} <= set(names)
    assert not [n for n in names if n.startswith("assets/") or "__pycache__" in n]


def test_a_worker_sees_only_the_jars_and_its_own_folder_of_the_runtime(tmp_path: Path) -> None:
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    script = namespace_script(settings, ClusterPaths.of(settings))
    lines = script.splitlines()
    runtime, jars_dir, cluster_dir = tmp_path, tmp_path / "jars", tmp_path / "spark-cluster"
    assert f"mount -t tmpfs -o mode=0755 conflux-runtime {runtime}" in lines
    assert f"mount -o remount,ro {runtime}" in lines
    assert f"mount --bind /mnt/0 {jars_dir}" in lines
    assert f"mount -o remount,ro,bind {jars_dir}" in lines  # the jars read-only as well
    assert f"mount --bind /mnt/1 {cluster_dir}" in lines
    assert f"mount -o remount,ro,bind {cluster_dir}" not in lines  # the workers write there


def test_the_executor_report_never_hides_why_a_run_ended() -> None:
    """It runs in the runner's ``finally``: a dead driver gives no report, not a new error."""

    class DeadDriver:
        @property
        def sparkContext(self) -> None:  # noqa: N802  (pyspark's name)
            raise RuntimeError("the py4j gateway is closed")

    assert executors_report(DeadDriver()) is None  # type: ignore[arg-type]

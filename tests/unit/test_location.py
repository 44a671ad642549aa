"""Locations: one spelling per place, Path-like on the local disk, the settings' roots, the spec's
table locations, and the Spark settings a user may not change."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.location import Location, normalize
from pipelines.settings import load_settings
from pipelines.spark import refuse_unsafe_overrides
from pipelines.spec import SpecError, parse_spec


def test_one_spelling_per_place() -> None:
    assert normalize("s3://lake//bronze/orders/") == "s3a://lake/bronze/orders"
    assert normalize("S3A://lake/x") == "s3a://lake/x"
    assert normalize("file:///tmp/x") == normalize("file:/tmp/x") == "/tmp/x"
    # `..` is kept as written: flow identities recorded table paths so
    assert normalize("../shared/t", base=Path("/rt")) == "/rt/../shared/t"
    for refused, why in [
        ("gs://lake/x", "not on gs:"),
        ("file://host/x", "not a host"),
        ("s3a:/lake/x", "not on s3a:"),
    ]:
        with pytest.raises(ConfigError, match=why):
            normalize(refused)


def test_a_local_location_reads_and_writes_like_a_path(tmp_path: Path) -> None:
    folder = Location.local(tmp_path) / "flow"
    assert not folder.exists() and folder.names() == []
    (folder / "b.json").write_json({"b": 1})
    assert (folder / "a").create(b"first") and not (folder / "a").create(b"second")
    assert (folder / "a").read_bytes() == b"first"
    (folder / "sub" / "c").touch()
    assert folder.exists() and folder.names() == ["a", "b.json"]  # files only, sorted
    assert Path(folder) == tmp_path / "flow" and folder.path == tmp_path / "flow"
    target = Location.local(tmp_path) / "archive" / "flow-1"
    folder.move_to(target)
    assert not folder.exists() and (target / "sub" / "c").exists()
    target.remove_tree()
    assert not target.exists()
    with pytest.raises(FileNotFoundError):
        (folder / "gone").read_text()
    assert (folder / "x").with_suffix_appended("__refresh").name == "x__refresh"


def test_an_s3_location_is_not_a_local_path() -> None:
    from pipelines.storage import S3Connection

    location = Location.of("s3a://lake/flows", S3Connection("http://s3.test", "key", "secret"))
    assert not location.is_local and location.delta_rs_options()["AWS_ALLOW_HTTP"] == "true"
    assert "secret" not in repr(location)
    with pytest.raises(TypeError, match="object store"):
        Path(location)
    with pytest.raises(ConfigError, match="not on the local disk"):
        _ = location.path


def test_roots_are_checked_when_the_settings_load() -> None:
    creds = {"CONFLUX_S3_ACCESS_KEY_ID": "k", "CONFLUX_S3_SECRET_ACCESS_KEY": "s"}
    settings = load_settings({"CONFLUX_LAKE_ROOT": "s3://lake//conflux/", **creds})
    assert settings.lake_root == "s3a://lake/conflux" and str(settings.lake) == settings.lake_root
    with pytest.raises(ConfigError, match="CONFLUX_S3_ACCESS_KEY_ID"):
        load_settings({"CONFLUX_CHECKPOINTS_ROOT": "S3A://lake/ck"})
    with pytest.raises(ConfigError, match=r"checkpoints_root: gs://x: .*s3a://bucket/prefix"):
        load_settings({"CONFLUX_CHECKPOINTS_ROOT": "gs://x"})


def test_a_table_needs_a_prefix_of_its_own_in_a_bucket() -> None:
    def spec(path: str) -> dict[str, object]:
        return {
            "name": "orders",
            "source": {"kind": "kafka", "topics": ["orders"]},
            "target": {"table": "orders", "path": path},
        }

    with pytest.raises(SpecError, match=r"target\.path: 's3a://lake' is a bucket's root"):
        parse_spec(spec("s3a://lake"))
    with pytest.raises(SpecError, match="not a host"):
        parse_spec(spec("file://host/x"))
    assert parse_spec(spec("file:/tmp/orders")).target.path == "file:/tmp/orders"


def test_spark_conf_may_not_change_how_commits_are_made_on_s3() -> None:
    refuse_unsafe_overrides({"spark.sql.shuffle.partitions": "8"})
    for key, value in [
        ("spark.hadoop.fs.s3a.create.conditional.enabled", "false"),
        ("spark.hadoop.fs.s3a.bucket.lake.create.conditional.enabled", "false"),
        ("spark.delta.logStore.s3a.impl", "io.delta.storage.S3SingleDriverLogStore"),
    ]:
        with pytest.raises(ConfigError, match=f"spark_conf: {key}={value} would let a commit"):
            refuse_unsafe_overrides({key: value})

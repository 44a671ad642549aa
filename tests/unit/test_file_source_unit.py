"""The file source's folder, option and stored-schema logic; no JVM needed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pipelines.errors import ConfigError
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.sources.files import (
    archive_folder,
    check_options,
    check_schema,
    extra_columns,
    hadoop_path,
    has_data_files,
    landing_folder,
    load_schema,
    local_path,
    partition_base,
    prepare_batch,
    quote,
    store_schema,
    stream_options,
)
from pipelines.spec import FileSource

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("amount", DoubleType()),
        StructField("tags", ArrayType(StringType())),
        StructField("address", StructType([StructField("city", StringType())])),
    ]
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(runtime_dir=tmp_path / "runtime", jars_dir=tmp_path / "jars")


# --- folders and options ---------------------------------------------------------------------


def test_landing_folder_is_resolved_under_the_runtime_dir_and_created(settings: Settings) -> None:
    folder = landing_folder(settings, FileSource(path="landing/orders"))
    assert folder == settings.runtime_dir / "landing" / "orders"
    assert folder.is_dir()


def test_absolute_landing_folder_is_kept(settings: Settings, tmp_path: Path) -> None:
    assert landing_folder(settings, FileSource(path=str(tmp_path / "abs"))) == tmp_path / "abs"


@pytest.mark.parametrize(
    ("archive_dir", "where"),
    [
        ("landing/orders", "inside"),
        ("landing/orders/.", "inside"),
        ("landing/orders/archive", "inside"),
        ("landing/x/../orders/done", "inside"),
        ("landing", "a parent of"),
        (".", "a parent of"),
    ],
)
def test_archive_dir_overlapping_the_landing_folder_is_rejected(
    settings: Settings, archive_dir: str, where: str
) -> None:
    """Spark fails the query for these (checked against Spark 4.1 by hand)."""
    source = FileSource(path="landing/orders", archive_dir=archive_dir)
    with pytest.raises(ConfigError, match=f"is {where} the landing folder"):
        archive_folder(settings, source)
    with pytest.raises(ConfigError, match="archive_dir"):
        stream_options(source, settings)


@pytest.mark.parametrize(
    "archive_dir", ["archive/orders", "landing/orders-archive", "landing/other/orders"]
)
def test_archive_dir_beside_the_landing_folder_is_accepted(
    settings: Settings, archive_dir: str
) -> None:
    source = FileSource(path="landing/orders", archive_dir=archive_dir)
    expected = (settings.runtime_dir / archive_dir).resolve()
    assert archive_folder(settings, source) == expected


def test_stream_options_pass_through_and_add_trigger_size_and_archiving(
    settings: Settings,
) -> None:
    source = FileSource(
        path="landing/prices",
        format="csv",
        options={"sep": ";", "encoding": "latin1"},
        max_files_per_trigger=5,
        archive_dir="archive",
    )
    assert stream_options(source, settings) == {
        "sep": ";",
        "encoding": "latin1",
        "maxFilesPerTrigger": "5",
        "cleanSource": "archive",
        "sourceArchiveDir": str((settings.runtime_dir / "archive").resolve()),
    }


def test_stream_options_without_extras_are_the_spec_options(settings: Settings) -> None:
    source = FileSource(path="in", options={"allowComments": "true"})
    assert stream_options(source, settings) == {"allowComments": "true"}


@pytest.mark.parametrize("option", ["multiLine", "multiline", "wholetext"])
def test_json_options_that_break_line_reading_are_rejected(option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        check_options(FileSource(path="in", options={option: "true"}))


def test_csv_may_use_multiline() -> None:
    check_options(FileSource(path="in", format="csv", options={"multiLine": "true"}))


# --- data files ------------------------------------------------------------------------------


def test_hidden_files_and_empty_folders_are_no_data(tmp_path: Path) -> None:
    (tmp_path / ".keep").write_text("")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "_temporary").mkdir()
    (tmp_path / "_temporary" / "part-0.json").write_text("{}")
    assert not has_data_files(tmp_path)


def test_a_file_in_a_subfolder_is_data(tmp_path: Path) -> None:
    (tmp_path / "date=2024-01-01").mkdir()
    (tmp_path / "date=2024-01-01" / "a.json").write_text("{}")
    assert has_data_files(tmp_path)


# --- stored schema ---------------------------------------------------------------------------


def test_schema_round_trips_as_spark_schema_json(tmp_path: Path) -> None:
    schema_file = Location.local(tmp_path / "checkpoints" / "flow" / "source_schema.json")
    store_schema(schema_file, SCHEMA)
    assert schema_file.read_text() == SCHEMA.json()
    assert load_schema(schema_file) == SCHEMA
    assert [p.name for p in schema_file.parent.path.iterdir()] == ["source_schema.json"]


def test_storing_replaces_the_schema_file(tmp_path: Path) -> None:
    schema_file = Location.local(tmp_path / "source_schema.json")
    store_schema(schema_file, StructType([StructField("old", StringType())]))
    store_schema(schema_file, SCHEMA)
    assert load_schema(schema_file) == SCHEMA


@pytest.mark.parametrize("text", ["not json", '{"type": "struct"}', "[1, 2]"])
def test_unreadable_schema_file_names_the_file(tmp_path: Path, text: str) -> None:
    schema_file = Location.local(tmp_path / "source_schema.json")
    schema_file.write_text(text)
    with pytest.raises(ConfigError, match=r"source_schema\.json") as error:
        load_schema(schema_file)
    assert "delete it" in str(error.value)


@pytest.mark.parametrize(
    "name", ["_rescued_data", "source_file", "source_modified_at", "_corrupt_record"]
)
def test_data_columns_may_not_use_the_source_column_names(tmp_path: Path, name: str) -> None:
    schema_file = Location.local(tmp_path / "source_schema.json")
    schema_file.write_text(json.dumps(StructType([StructField(name, StringType())]).jsonValue()))
    with pytest.raises(ConfigError, match=name):
        load_schema(schema_file)


def test_an_empty_schema_is_rejected() -> None:
    with pytest.raises(ConfigError, match="no columns"):
        check_schema(StructType([]), where="the files in /landing")


def test_quote_takes_dots_and_backquotes_literally() -> None:
    assert quote("a.b") == "`a.b`"
    assert quote("we`ird") == "`we``ird`"


# --- the per-micro-batch hook (Parquet rescue) ---------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_prepare_batch_returns_json_and_csv_batches_untouched(fmt: str) -> None:
    """No Spark call at all: the batch object itself comes back (a stand-in proves it)."""
    batch = cast(Any, object())
    assert prepare_batch(batch, FileSource(path="in", format=fmt), SCHEMA) is batch


def test_prepare_batch_needs_exactly_the_stream_columns() -> None:
    """Called after ingestion columns were added, it fails before running any Spark job."""
    columns = [*SCHEMA.fieldNames(), "_rescued_data", "source_file", "source_modified_at"]
    batch = cast(Any, SimpleNamespace(columns=[*columns, "ingested_at"]))
    with pytest.raises(ValueError, match="before adding ingestion columns"):
        prepare_batch(batch, FileSource(path="in", format="parquet"), SCHEMA)


def test_extra_columns_are_those_the_schema_lacks_in_file_order() -> None:
    columns = ["zip", "id", "tags", "extra", "amount", "address"]
    assert extra_columns(columns, SCHEMA, case_sensitive=False) == ["zip", "extra"]
    assert extra_columns(["id", "amount"], SCHEMA, case_sensitive=False) == []


def test_extra_columns_match_names_the_way_spark_reads_parquet() -> None:
    """Case-insensitively by default (``ID`` reads into ``id``), exactly when case-sensitive."""
    assert extra_columns(["ID", "Amount", "x"], SCHEMA, case_sensitive=False) == ["x"]
    assert extra_columns(["ID", "Amount", "x"], SCHEMA, case_sensitive=True) == [
        "ID",
        "Amount",
        "x",
    ]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:/lake/landing/a.parquet", Path("/lake/landing/a.parquet")),
        ("file:///lake/landing/a.parquet", Path("/lake/landing/a.parquet")),
        ("file://localhost/lake/a.parquet", Path("/lake/a.parquet")),
        ("file:/lake/b%20extra%5B1%5D%25.parquet", Path("/lake/b extra[1]%.parquet")),
        ("s3a://bucket/landing/a.parquet", None),
        ("hdfs://nn:8020/landing/a.parquet", None),
        ("file://otherhost/lake/a.parquet", None),
    ],
)
def test_local_path_of_a_source_file_uri(uri: str, expected: Path | None) -> None:
    assert local_path(uri) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:/lake/b%20extra%5B1%5D.parquet", "file:/lake/b extra[1].parquet"),
        ("s3a://bucket/landing/a%20b.parquet", "s3a://bucket/landing/a b.parquet"),
        ("hdfs://nn:8020/x/a.parquet", "hdfs://nn:8020/x/a.parquet"),
    ],
)
def test_hadoop_path_decodes_the_uri_spark_reports(uri: str, expected: str) -> None:
    assert hadoop_path(uri) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("file:/lake/landing/a.parquet", None),
        ("file:/lake/landing/day=1/a.parquet", "file:/lake/landing"),
        ("file:/lake/landing/date=2024-01-01/h=3/a.parquet", "file:/lake/landing"),
        ("s3a://bucket/landing/day=1/a=b.parquet", "s3a://bucket/landing"),
        ("file:/lake/day=1/sub/a.parquet", None),  # only trailing key=value folders count
    ],
)
def test_partition_base_is_the_folder_above_key_value_folders(
    path: str, expected: str | None
) -> None:
    assert partition_base(path) == expected

"""The file landing-zone source against a real Spark session, driven into a Delta table."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import StructType

from pipelines.errors import ConfigError
from pipelines.location import Location
from pipelines.settings import Settings, load_settings
from pipelines.sources.files import load_schema, local_path, prepare_batch, read_files_stream
from pipelines.spark import get_spark_session
from pipelines.spec import FileSource

METADATA_COLUMNS = ["_rescued_data", "source_file", "source_modified_at"]
STREAM_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One session for this module (no Kafka broker needed, unlike the folder's shared one).

    If a session is already active (the session-wide fixture of another module), it is re-used
    and left running: stopping it would break the modules that still use it.
    """
    already_active = SparkSession.getActiveSession() is not None
    settings = replace(load_settings(), runtime_dir=tmp_path_factory.mktemp("spark-runtime"))
    session = get_spark_session("test-file-source", settings, ui=False)
    yield session
    if not already_active:
        session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings whose runtime folder is the test's tmp dir, so relative spec paths land there."""
    return replace(load_settings(), runtime_dir=tmp_path)


class Flow:
    """One flow's folders under the test's runtime dir, and helpers to run it once."""

    def __init__(self, spark: SparkSession, settings: Settings, source: FileSource) -> None:
        self.spark, self.settings, self.source = spark, settings, source
        root = settings.runtime_dir
        self.landing = root / source.path
        self.checkpoint = root / "checkpoints" / "flow"
        self.schema_file = Location.local(self.checkpoint / "source_schema.json")
        self.table = root / "lake" / "bronze" / "flow"

    def drop(self, name: str, text: str) -> Path:
        self.landing.mkdir(parents=True, exist_ok=True)
        path = self.landing / name
        path.write_text(text)
        return path

    def read(self) -> DataFrame:
        return read_files_stream(self.spark, self.source, self.settings, self.schema_file)

    def run(self, frame: DataFrame | None = None) -> DataFrame:
        """Run the stream to the end of the available files (availableNow) into the Delta table."""
        query = (
            (frame if frame is not None else self.read())
            .writeStream.format("delta")
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start(str(self.table))
        )
        if not query.awaitTermination(STREAM_TIMEOUT_S):
            query.stop()
            pytest.fail(f"the stream did not finish within {STREAM_TIMEOUT_S}s")
        return self.result()

    def run_prepared(self, frame: DataFrame | None = None) -> list[Batch]:
        """Run the stream (availableNow) the way the bronze sink does: ``foreachBatch`` calling
        :func:`prepare_batch` on each micro-batch, then writing the result (here: collecting it).

        Returns, per micro-batch, the Spark jobs the hook ran, whether it returned the batch
        itself, and the rows it returned.
        """
        frame = frame if frame is not None else self.read()
        schema = load_schema(self.schema_file)
        tracker = self.spark.sparkContext.statusTracker()
        batches: list[Batch] = []

        def write(batch: DataFrame, batch_id: int) -> None:
            group = self.spark.sparkContext.getLocalProperty("spark.jobGroup.id")
            before = set(tracker.getJobIdsForGroup(group))
            prepared = prepare_batch(batch, self.source, schema)
            jobs = len(set(tracker.getJobIdsForGroup(group)) - before)
            assert prepared.columns == batch.columns
            batches.append(Batch(jobs, prepared is batch, prepared.collect()))

        query = (
            frame.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(STREAM_TIMEOUT_S):
            query.stop()
            pytest.fail(f"the stream did not finish within {STREAM_TIMEOUT_S}s")
        assert query.exception() is None
        return batches

    def result(self) -> DataFrame:
        return self.spark.read.format("delta").load(str(self.table))


@dataclass(frozen=True)
class Batch:
    """What :func:`prepare_batch` did to one micro-batch."""

    jobs: int
    unchanged: bool
    rows: list[Row]


def data(frame: DataFrame, order_by: str = "id") -> list[tuple]:
    """Rows without the file metadata columns, sorted by ``order_by``."""
    columns = [c for c in frame.columns if c not in ("source_file", "source_modified_at")]
    return [tuple(r) for r in frame.select(*columns).orderBy(order_by).collect()]


def file_path(uri: str) -> Path:
    return Path(urlparse(uri).path)


def rescued(row: Row) -> dict | None:
    return None if row["_rescued_data"] is None else json.loads(row["_rescued_data"])


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


# --- JSON ------------------------------------------------------------------------------------


def test_json_rows_typed_and_everything_else_rescued(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/orders"))
    first = flow.drop(
        "a.json",
        '{"id": 1, "amount": 2.5, "name": "apple"}\n{"id": 2, "amount": 10.0, "name": "pear"}\n',
    )
    frame = flow.read()  # infers the schema from a.json
    second = flow.drop(
        "b.json",
        "\n".join(
            [
                '{"id": 3, "amount": 1.25, "name": "fig", "coupon": "X1"}',
                "",
                '{"id": 4, "amount": "abc", "name": "kiwi"}',
                '{"id": 5, "amount": 3.0, "na',
            ]
        )
        + "\n",
    )

    table = flow.run(frame)

    assert table.columns == ["amount", "id", "name", *METADATA_COLUMNS]
    assert dict(table.dtypes) == {
        "amount": "double",
        "id": "bigint",
        "name": "string",
        "_rescued_data": "string",
        "source_file": "string",
        "source_modified_at": "timestamp",
    }
    collected = table.collect()
    assert {r["id"]: (r["amount"], r["name"], rescued(r)) for r in collected} == {
        1: (2.5, "apple", None),
        2: (10.0, "pear", None),
        3: (1.25, "fig", {"coupon": "X1"}),  # an unknown field
        4: (None, "kiwi", {"amount": "abc"}),  # a string where the schema has a double
        None: (None, None, {"_corrupt_record": '{"id": 5, "amount": 3.0, "na'}),  # truncated
    }
    for row in collected:
        expected = first if row["id"] in (1, 2) else second
        assert file_path(row["source_file"]) == expected
        modified = datetime.fromtimestamp(expected.stat().st_mtime)
        assert abs((row["source_modified_at"] - modified).total_seconds()) < 1


def test_json_nested_values_that_do_not_fit_are_rescued_whole(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/people"))
    flow.drop("a.json", '{"id": 1, "address": {"city": "Oslo"}, "scores": [1, 2]}\n')
    frame = flow.read()
    flow.drop(
        "b.json",
        '{"id": 2, "address": {"city": "Bergen", "zip": "5003"}, "scores": []}\n'
        '{"id": 3, "address": "Main street 1", "scores": [3, "four"]}\n'
        '{"id": 4, "address": null, "scores": null, "ID": 40}\n'
        "   \n"
        "[1, 2]\n",
    )

    table = flow.run(frame)

    rows = {r["id"]: (r["address"], r["scores"], rescued(r)) for r in table.collect()}
    assert rows == {
        1: (Row(city="Oslo"), [1, 2], None),
        # an unknown nested key: the typed struct keeps what fits, the raw object is rescued
        2: (Row(city="Bergen"), [], {"address": '{"city":"Bergen","zip":"5003"}'}),
        3: (None, None, {"address": "Main street 1", "scores": '[3,"four"]'}),
        # JSON nulls are not mismatches; names match case-sensitively
        4: (None, None, {"ID": "40"}),
        None: (None, None, {"_corrupt_record": "[1, 2]"}),
    }


def test_schema_is_stored_once_and_enforced(spark: SparkSession, settings: Settings) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/events"))
    flow.drop("a.json", '{"id": 1, "kind": "click"}\n')

    first = flow.run()

    stored = flow.schema_file.read_text()
    assert StructType.fromJson(json.loads(stored)).simpleString() == "struct<id:bigint,kind:string>"
    assert data(first) == [(1, "click", None)]

    flow.drop("b.json", '{"id": 2, "kind": "view", "device": "phone", "ms": 12}\n')
    second = flow.run()

    assert flow.schema_file.read_text() == stored
    assert second.columns == ["id", "kind", *METADATA_COLUMNS]
    assert data(second) == [(1, "click", None), (2, "view", '{"device":"phone","ms":"12"}')]


# --- CSV -------------------------------------------------------------------------------------


def test_csv_row_that_does_not_fit_keeps_its_raw_line(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(
        spark, settings, FileSource(path="landing/prices", format="csv", options={"sep": ";"})
    )
    flow.drop("a.csv", "id;amount;name\n1;2.5;apple\n2;3.75;pear\n")
    frame = flow.read()
    flow.drop("b.csv", "id;amount;name\n3;abc;kiwi\n4;1.5;fig;extra\n5;0.5\n6;9.0;plum\n")

    table = flow.run(frame)

    assert dict(table.dtypes) == {
        "id": "int",
        "amount": "double",
        "name": "string",
        "_rescued_data": "string",
        "source_file": "string",
        "source_modified_at": "timestamp",
    }
    assert data(table) == [
        (1, 2.5, "apple", None),
        (2, 3.75, "pear", None),
        (3, None, "kiwi", '{"_corrupt_record":"3;abc;kiwi"}'),
        (4, 1.5, "fig", '{"_corrupt_record":"4;1.5;fig;extra"}'),
        (5, 0.5, None, '{"_corrupt_record":"5;0.5"}'),
        (6, 9.0, "plum", None),
    ]
    assert {file_path(r["source_file"]).name for r in table.collect()} == {"a.csv", "b.csv"}


# --- Parquet ---------------------------------------------------------------------------------


def write_parquet(path: Path, columns: dict[str, pa.Array]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def test_parquet_basic(spark: SparkSession, settings: Settings) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/metrics", format="parquet"))
    write_parquet(
        flow.landing / "a.parquet",
        {"id": pa.array([1, 2], pa.int64()), "value": pa.array([0.5, 1.5]), "tag": ["x", "y"]},
    )

    table = flow.run()

    assert table.columns == ["id", "value", "tag", *METADATA_COLUMNS]
    assert data(table) == [(1, 0.5, "x", None), (2, 1.5, "y", None)]
    assert {file_path(r["source_file"]) for r in table.collect()} == {flow.landing / "a.parquet"}
    assert all(r["source_modified_at"] is not None for r in table.collect())


def test_parquet_stream_alone_drops_extra_reads_missing_as_null_widens(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/metrics", format="parquet"))
    write_parquet(
        flow.landing / "a.parquet",
        {"id": pa.array([1], pa.int64()), "value": pa.array([0.5]), "tag": ["x"]},
    )
    frame = flow.read()
    # no tag, an extra column, and narrower types Spark can widen (int32 -> long, float32 -> double)
    write_parquet(
        flow.landing / "b.parquet",
        {"id": pa.array([2], pa.int32()), "value": pa.array([2.5], pa.float32()), "extra": ["e"]},
    )

    table = flow.run(frame)  # without prepare_batch: the extra column is not rescued

    assert table.columns == ["id", "value", "tag", *METADATA_COLUMNS]
    assert data(table) == [(1, 0.5, "x", None), (2, 2.5, None, None)]


def test_parquet_extra_columns_rescued_by_prepare_batch(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/metrics", format="parquet"))
    write_parquet(
        flow.landing / "a.parquet",
        {"id": pa.array([1], pa.int64()), "value": pa.array([0.5]), "tag": ["x"]},
    )
    frame = flow.read()  # stored schema: id bigint, value double, tag string
    nested = pa.struct([("a", pa.int64()), ("b", pa.string())])
    # extra columns, an int and a nested struct; narrower types Spark widens; a name that is
    # percent-encoded in source_file. (No glob characters: with a file named like `b[1].parquet`
    # in a micro-batch, Spark 4.1.3's file stream source reads the batch's other files twice.)
    extra = flow.landing / "b extra.parquet"
    write_parquet(
        extra,
        {
            "id": pa.array([2, 3, 4], pa.int32()),
            "value": pa.array([2.5, 3.5, 4.5], pa.float32()),
            "tag": ["y", None, "w"],
            "n": pa.array([7, None, None], pa.int32()),
            "s": pa.array([{"a": 1, "b": "p"}, {"a": None, "b": "q"}, None], nested),
        },
    )
    missing = flow.landing / "c.parquet"
    write_parquet(missing, {"id": pa.array([5], pa.int64()), "value": pa.array([5.5])})

    [batch] = flow.run_prepared(frame)

    # one micro-batch: 2 jobs for the distinct file names (adaptive execution: shuffle map stage
    # + result), none for the footers (pyarrow), 1 for the Spark types of the extra columns
    assert (batch.jobs, batch.unchanged) == (3, False)
    assert batch.rows[0].asDict().keys() == {"id", "value", "tag", *METADATA_COLUMNS}
    assert {r["id"]: (r["value"], r["tag"], rescued(r)) for r in batch.rows} == {
        1: (0.5, "x", None),
        2: (2.5, "y", {"n": 7, "s": {"a": 1, "b": "p"}}),
        3: (3.5, None, {"s": {"b": "q"}}),  # null values are left out
        4: (4.5, "w", None),  # every extra value null: nothing was lost
        5: (5.5, None, None),  # a missing column reads as null
    }
    assert len(batch.rows) == 5
    assert {r["id"]: local_path(r["source_file"]) for r in batch.rows} == {
        1: flow.landing / "a.parquet",
        2: extra,
        3: extra,
        4: extra,
        5: missing,
    }
    modified = {r["id"]: r["source_modified_at"] for r in batch.rows}
    assert modified[2] == modified[3] == modified[4] is not None
    assert abs((modified[2] - datetime.fromtimestamp(extra.stat().st_mtime)).total_seconds()) < 1

    # a later batch of files that fit: after the file-name query the hook returns the batch
    write_parquet(flow.landing / "d.parquet", {"id": pa.array([6], pa.int64()), "tag": ["v"]})
    [later] = flow.run_prepared()
    assert (later.jobs, later.unchanged) == (2, True)
    assert [(r["id"], r["value"], r["tag"], r["_rescued_data"]) for r in later.rows] == [
        (6, None, "v", None)
    ]


def test_parquet_rescue_keeps_partition_columns(spark: SparkSession, settings: Settings) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/metrics", format="parquet"))
    write_parquet(flow.landing / "day=1" / "a.parquet", {"id": pa.array([1], pa.int64())})
    frame = flow.read()  # stored schema: id bigint, day int (from the folder name)
    write_parquet(
        flow.landing / "day=2" / "b.parquet",
        {"id": pa.array([2], pa.int64()), "extra": ["e"]},
    )

    [batch] = flow.run_prepared(frame)

    assert sorted((r["id"], r["day"], r["_rescued_data"]) for r in batch.rows) == [
        (1, 1, None),
        (2, 2, '{"extra":"e"}'),
    ]


def test_parquet_type_mismatch_fails_the_query(spark: SparkSession, settings: Settings) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/metrics", format="parquet"))
    write_parquet(
        flow.landing / "a.parquet", {"id": pa.array([1], pa.int64()), "value": pa.array([0.5])}
    )
    frame = flow.read()
    write_parquet(flow.landing / "b.parquet", {"id": pa.array([2], pa.int64()), "value": ["abc"]})

    with pytest.raises(StreamingQueryException, match="PARQUET_COLUMN_DATA_TYPE_MISMATCH"):
        flow.run(frame)


# --- empty landing folder, archiving ---------------------------------------------------------


def test_empty_landing_folder_is_created_and_rejected(
    spark: SparkSession, settings: Settings
) -> None:
    flow = Flow(spark, settings, FileSource(path="landing/nothing_yet"))

    with pytest.raises(ConfigError) as error:
        flow.read()

    assert str(flow.landing) in str(error.value)
    assert "inferred from the first files" in str(error.value)
    assert flow.landing.is_dir()
    assert not flow.schema_file.exists()

    flow.drop(".keep", "")
    with pytest.raises(ConfigError, match="has no files"):
        flow.read()


def test_processed_files_are_archived_when_the_next_batch_is_planned(
    spark: SparkSession, settings: Settings
) -> None:
    source = FileSource(path="landing/logs", archive_dir="archive", max_files_per_trigger=1)
    flow = Flow(spark, settings, source)
    archive = settings.runtime_dir / "archive"
    paths = [flow.drop(f"f{i}.json", f'{{"id": {i}}}\n') for i in range(2)]

    def archived(path: Path) -> Path:
        return archive / path.relative_to(path.anchor)

    # run 1: two micro-batches; f0 is archived when the batch of f1 is planned, f1 stays
    assert data(flow.run()) == [(0, None), (1, None)]
    assert wait_for(lambda: archived(paths[0]).exists())
    assert not paths[0].exists()
    assert archived(paths[0]).read_text() == '{"id": 0}\n'
    assert paths[1].exists()

    # run 2 with a new file: planning its batch archives f1; the new file stays for a later run
    paths.append(flow.drop("f2.json", '{"id": 2}\n'))
    assert data(flow.run()) == [(0, None), (1, None), (2, None)]
    assert wait_for(lambda: archived(paths[1]).exists())
    assert not paths[1].exists()
    assert paths[2].exists()

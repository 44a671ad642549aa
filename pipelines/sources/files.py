"""The file landing-zone source: JSON lines, CSV with a header, or Parquet files dropped in a folder.

:func:`read_files_stream` returns a streaming DataFrame with the typed data columns of the
flow's *stored* schema, then ``_rescued_data``, ``source_file`` and ``source_modified_at``.

Schema: inferred once, stored, then enforced
    On the first run the schema is inferred with a batch read of the files already in the landing
    folder and written, as Spark's schema JSON, to the flow's schema file. Every later run loads
    that file and never infers again, so a new field in later files cannot change the table schema.
    To adopt a new schema on purpose, edit or delete the schema file.

Nothing is lost: ``_rescued_data``
    ``_rescued_data`` is a JSON object (a string) holding what the typed columns could not hold,
    or null when the record fit the schema.

    * JSON lines: every line is read as text and parsed twice, once against the stored schema and
      once as a map of raw values. ``_rescued_data`` holds every key that is not in the schema and
      every field whose raw value the typed column does not fully hold: the typed value came out
      null (``"amount": "abc"`` for a double), or, for a struct or array field, something nested
      was unknown or mistyped (the whole raw value of the top-level field is then kept, while the
      typed column holds what could be parsed). Values are kept as raw JSON text. A line that is
      not a JSON object at all (truncated, ``42``, ``[1]``) gets null typed columns and
      ``{"_corrupt_record": "<the line>"}``. Blank lines are skipped. Field names match
      case-sensitively (``"ID"`` is rescued when the schema has ``id``). Map-typed fields (never
      inferred from JSON) are only checked as a whole.
    * CSV: read with the stored schema in PERMISSIVE mode; a row that does not fit (a value of the
      wrong type, more or fewer values than the schema has columns) keeps its typed values where
      they parsed and gets ``{"_corrupt_record": "<the raw line>"}``. The header line is not
      checked against the schema: columns are matched by position (Spark's ``enforceSchema``), so
      a file with an added column shows up as rows with too many values, which are rescued.
    * Parquet: Parquet files carry their own typed schema, so the only thing a file can hold that
      the typed columns cannot is a column the stored schema lacks. Such columns are rescued by
      :func:`prepare_batch`, the per-micro-batch hook the bronze sink calls in ``foreachBatch``
      (the streaming DataFrame itself always has a null ``_rescued_data`` for Parquet): the rows
      of a file with extra top-level columns get ``_rescued_data`` = ``to_json`` of a struct of
      those columns, values as JSON values (``{"n": 7, "s": {"a": 1}}``), null fields left out,
      and null when all of the row's extra values are null (a null lost nothing). Read with
      ``from_json(_rescued_data, "map<string,string>")`` it gives the same raw JSON text per key
      as the JSON source's rescue. Names match the way Spark matches Parquet columns
      (case-insensitively unless ``spark.sql.caseSensitive``). Otherwise, reading with the stored
      schema, Spark 4.1 treats a file that differs from it like this (checked by the tests):

      - a column missing from the file reads as null;
      - a field added *inside* a struct column of the stored schema is dropped (only top-level
        columns are rescued);
      - a column of another type reads when Spark can widen it losslessly (int to long or double,
        float to double); any other difference (long where the schema has int, string where it
        has double, ...) fails the query with ``FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH``
        naming the file and the column, and every restart fails on that file again until it is
        removed or the schema file is edited.

      Adding a Parquet column to the table as a typed column therefore needs an edit of the
      schema file; until then its values are in ``_rescued_data``.

Options
    ``source.options`` pass through to Spark's reader (e.g. CSV ``sep``; for JSON they also reach
    the parser, e.g. ``allowComments``). ``max_files_per_trigger`` becomes ``maxFilesPerTrigger``.
    With ``archive_dir``, Spark moves each processed file to ``<archive_dir>/<its full path>``
    (``cleanSource=archive``), e.g. ``/lake/archive/lake/landing/a.json``. It does so in a
    background thread when it plans the *next* micro-batch, after the batch holding the file
    was committed: the files of a run's last micro-batch stay in the landing folder until a
    later run finds new files (a run without new files archives nothing). They are never read
    twice: the checkpoint remembers them.

``source_file`` is the file's URI as Spark reports it (``file:/lake/landing/a.json``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import reduce
from itertools import chain
from operator import or_
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    StringType,
    StructField,
    StructType,
)

from pipelines.catalog.state import resolve
from pipelines.errors import ConfigError
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import FileSource

RESCUED_COLUMN = "_rescued_data"
SOURCE_FILE_COLUMN = "source_file"
SOURCE_MODIFIED_COLUMN = "source_modified_at"
CORRUPT_RECORD = "_corrupt_record"
#: Names the source adds itself; a data column may not use them.
RESERVED_COLUMNS = (RESCUED_COLUMN, SOURCE_FILE_COLUMN, SOURCE_MODIFIED_COLUMN, CORRUPT_RECORD)
#: JSON reader options that would break the one-record-per-line reading.
JSON_UNSUPPORTED_OPTIONS = ("multiline", "wholetext")

#: JSON objects parsed as raw values: nested values stay JSON text (a DDL string, as typed stubs
#: of ``from_json`` do not list ``MapType``).
RAW_MAP = "map<string,string>"
_LINE, _TYPED, _RAW, _METADATA = "__line", "__typed", "__raw", "_metadata"
#: Spark's internal reader option (``DataSource.GLOB_PATHS_KEY``) that its own file stream source
#: sets to read logged file paths literally: ``a[1].parquet`` is a file name, not a glob.
GLOB_PATHS_OPTION = "__globPaths__"


def read_files_stream(
    spark: SparkSession, source: FileSource, settings: Settings, schema_file: Location
) -> DataFrame:
    """A streaming DataFrame of the files landing in ``source.path``, typed by the stored schema.

    Columns: the stored schema's columns, ``_rescued_data``, ``source_file``, ``source_modified_at``.

    Raises:
        ConfigError: no schema is stored yet and the landing folder has no files to infer it
            from; the stored schema is unreadable; the options or the archive folder are invalid.
    """
    check_options(source)
    folder = landing_folder(settings, source)
    options = stream_options(source, settings)
    schema = load_or_infer_schema(spark, source, folder, schema_file)
    return _STREAM_READERS[source.format](spark, folder, schema, options, source.options)


# --- folders and options ---------------------------------------------------------------------


def landing_folder(settings: Settings, source: FileSource) -> Path:
    """The landing folder, created if missing (a landing zone may start empty)."""
    folder = resolve(settings, source.path).path  # a local path: the spec refuses a URI
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def archive_folder(settings: Settings, source: FileSource) -> Path:
    """The resolved archive folder, checked the way Spark checks it when the query starts.

    Spark moves a file to ``<archive>/<its full path>`` and refuses an archive folder where that
    could match the landing folder again: one inside the landing folder, the landing folder
    itself, or one of its parents.
    """
    if source.archive_dir is None:
        raise ValueError("the source has no archive_dir")
    landing = resolve(settings, source.path).path.resolve()
    archive = resolve(settings, source.archive_dir).path.resolve()
    if archive.is_relative_to(landing) or landing.is_relative_to(archive):
        where = "inside" if archive.is_relative_to(landing) else "a parent of"
        raise ConfigError(
            f"source.archive_dir {archive} is {where} the landing folder {landing}: Spark "
            "refuses an archive folder where archived files could be read again; choose one "
            "outside it, e.g. a sibling folder"
        )
    return archive


def check_options(source: FileSource) -> None:
    """Reject reader options that contradict how the format is read."""
    if source.format != "json":
        return
    bad = sorted(k for k in source.options if k.lower() in JSON_UNSUPPORTED_OPTIONS)
    if bad:
        raise ConfigError(
            f"source.options: {', '.join(bad)} is not supported for JSON files: they are read as "
            "JSON lines, one record per line"
        )


def stream_options(source: FileSource, settings: Settings) -> dict[str, str]:
    """Reader options for the stream: the spec's options plus trigger size and archiving."""
    options = dict(source.options)
    if source.max_files_per_trigger is not None:
        options["maxFilesPerTrigger"] = str(source.max_files_per_trigger)
    if source.archive_dir is not None:
        options["cleanSource"] = "archive"
        options["sourceArchiveDir"] = str(archive_folder(settings, source))
    return options


# --- the stored schema -----------------------------------------------------------------------


def load_or_infer_schema(
    spark: SparkSession, source: FileSource, folder: Path, schema_file: Location
) -> StructType:
    """The stored schema; on the first run it is inferred from the files in ``folder`` and stored."""
    if not schema_file.exists():
        store_schema(schema_file, infer_schema(spark, source, folder))
    return load_schema(schema_file)


def infer_schema(spark: SparkSession, source: FileSource, folder: Path) -> StructType:
    """Infer the schema with a batch read of the files currently in ``folder``."""
    if not has_data_files(folder):
        raise ConfigError(
            f"the landing folder {folder} has no files: the schema of a file source is inferred "
            "from the first files, so drop some files there first, or write the schema "
            "(Spark schema JSON) to the flow's schema file yourself"
        )
    reader = spark.read.options(**source.options)
    if source.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    try:
        inferred = reader.format(source.format).load(str(folder)).schema
    except AnalysisException as exc:
        raise ConfigError(f"could not infer the schema from the files in {folder}: {exc}") from exc
    schema = StructType([f for f in inferred.fields if f.name != CORRUPT_RECORD])
    check_schema(schema, where=f"the files in {folder}")
    return schema


def has_data_files(folder: Path) -> bool:
    """Whether ``folder`` holds a file Spark would read (hidden ``_x`` / ``.x`` names are skipped)."""
    for entry in folder.iterdir():
        if entry.name.startswith(("_", ".")):
            continue
        if entry.is_file() or (entry.is_dir() and has_data_files(entry)):
            return True
    return False


def check_schema(schema: StructType, where: str) -> None:
    """A usable data schema: at least one column, none with a name the source adds itself."""
    if not schema.fields:
        raise ConfigError(f"no columns could be inferred from {where}: are they valid records?")
    clash = [n for n in schema.fieldNames() if n in RESERVED_COLUMNS]
    if clash:
        raise ConfigError(
            f"{where}: column(s) {', '.join(clash)} clash with column(s) the file source adds "
            f"({', '.join(RESERVED_COLUMNS)}); rename them in the data"
        )


def store_schema(schema_file: Location, schema: StructType) -> None:
    """Write ``schema`` as Spark schema JSON, atomically (a reader sees all of it or nothing)."""
    schema_file.write_text(schema.json())


def load_schema(schema_file: Location) -> StructType:
    """The stored schema; an unreadable file is a :class:`ConfigError` naming it."""
    try:
        schema = StructType.fromJson(json.loads(schema_file.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{schema_file}: not a valid Spark schema JSON ({exc}); fix it, or delete it to "
            "infer the schema again from the files in the landing folder"
        ) from exc
    check_schema(schema, where=str(schema_file))
    return schema


# --- stream readers --------------------------------------------------------------------------


def json_stream(
    spark: SparkSession,
    folder: Path,
    schema: StructType,
    options: Mapping[str, str],
    parser_options: Mapping[str, str],
) -> DataFrame:
    """JSON lines read as text, parsed against ``schema``; the rest goes to ``_rescued_data``."""
    lines = (
        spark.readStream.format("text")
        .options(**options)
        .option("wholetext", "false")
        .load(str(folder))
        .select(F.col("value").alias(_LINE), F.col(_METADATA))
        .where(F.col(_LINE).rlike(r"\S"))
    )
    raw = F.from_json(_LINE, RAW_MAP, dict(parser_options))
    typed = F.when(raw.isNotNull(), F.from_json(_LINE, schema, dict(parser_options)))
    parsed = lines.select(_LINE, _METADATA, raw.alias(_RAW), typed.alias(_TYPED))
    typed_col, raw_col = F.col(_TYPED), F.col(_RAW)
    return parsed.select(
        *(typed_col.getField(f.name).alias(f.name) for f in schema.fields),
        json_rescued_data(F.col(_LINE), raw_col, typed_col, schema).alias(RESCUED_COLUMN),
        *metadata_columns(),
    )


def csv_stream(
    spark: SparkSession,
    folder: Path,
    schema: StructType,
    options: Mapping[str, str],
    parser_options: Mapping[str, str],
) -> DataFrame:
    """CSV with a header, PERMISSIVE: a row that does not fit keeps its raw line."""
    read_schema = StructType([*schema.fields, StructField(CORRUPT_RECORD, StringType())])
    frame = (
        spark.readStream.format("csv")
        .options(**options)
        .option("header", "true")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
        .schema(read_schema)
        .load(str(folder))
    )
    corrupt = F.col(quote(CORRUPT_RECORD))
    return frame.select(
        *(F.col(quote(name)) for name in schema.fieldNames()),
        F.when(corrupt.isNotNull(), corrupt_record(corrupt)).alias(RESCUED_COLUMN),
        *metadata_columns(),
    )


def parquet_stream(
    spark: SparkSession,
    folder: Path,
    schema: StructType,
    options: Mapping[str, str],
    parser_options: Mapping[str, str],
) -> DataFrame:
    """Parquet read with ``schema``; ``_rescued_data`` is null until :func:`prepare_batch`."""
    frame = spark.readStream.format("parquet").options(**options).schema(schema).load(str(folder))
    return frame.select(
        *(F.col(quote(name)) for name in schema.fieldNames()),
        F.lit(None).cast(StringType()).alias(RESCUED_COLUMN),
        *metadata_columns(),
    )


_STREAM_READERS: Mapping[
    str,
    Callable[[SparkSession, Path, StructType, Mapping[str, str], Mapping[str, str]], DataFrame],
] = {"json": json_stream, "csv": csv_stream, "parquet": parquet_stream}

# --- the per-micro-batch hook ----------------------------------------------------------------


def prepare_batch(batch: DataFrame, source: FileSource, schema: StructType) -> DataFrame:
    """One micro-batch of :func:`read_files_stream`, completed before it is written.

    Call it in ``foreachBatch`` on the micro-batch DataFrame *before* adding any column:
    ``batch`` must have exactly the columns :func:`read_files_stream` returns (the stored
    ``schema``'s columns, ``_rescued_data``, ``source_file``, ``source_modified_at``, in that
    order), and the result has the same columns, so ingestion columns are added to the result.
    ``schema`` is the stored schema the stream was read with (:func:`load_schema`).

    * JSON and CSV: ``batch`` is returned as is; no Spark job.
    * Parquet: the distinct ``source_file`` values of ``batch`` are collected (one action; 2 jobs
      with adaptive execution, and it computes the micro-batch once more: in ``foreachBatch`` it
      is a fixed RDD, so no column is pruned). Each file's own top-level columns are read from
      its footer, with pyarrow for a ``file:`` URI (no job) and with Spark otherwise (one job per
      file). The rows of files with columns the stored schema lacks are replaced by a batch
      re-read of exactly those files with the stored schema plus their extra columns (the
      extra columns' Spark types are taken with one schema job per distinct set of extra
      columns and types, none for non-``file:`` URIs), ``_rescued_data`` holding the extra
      values (see the module docstring). Rows of the other files pass untouched, and when no
      file has extra columns ``batch`` itself is returned.

    Deterministic: a micro-batch's file set is fixed (a replay reads the same files), so the
    file list, the footers and the re-read are the same every time the batch runs.

    Raises:
        ValueError: ``batch`` does not have the columns :func:`read_files_stream` returns.
    """
    if source.format != "parquet":
        return batch
    expected = [*schema.fieldNames(), RESCUED_COLUMN, SOURCE_FILE_COLUMN, SOURCE_MODIFIED_COLUMN]
    if batch.columns != expected:
        raise ValueError(
            f"prepare_batch needs the columns read_files_stream returns, {expected}; got "
            f"{batch.columns} (call it before adding ingestion columns)"
        )
    spark = batch.sparkSession
    files = sorted(row[0] for row in batch.select(SOURCE_FILE_COLUMN).distinct().collect())
    case_sensitive = str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    spark_schemas: dict[tuple[tuple[str, str], ...], StructType] = {}
    for uri in files:
        columns, spark_schema = file_columns(spark, uri, source.options)
        extras = extra_columns(list(columns), schema, case_sensitive)
        if not extras:
            continue
        key = tuple((name, columns[name]) for name in extras)
        groups.setdefault(key, []).append(uri)
        if spark_schema is not None:
            spark_schemas.setdefault(key, spark_schema)
    if not groups:
        return batch
    rescued = []
    for key, uris in groups.items():
        file_schema = spark_schemas.get(key)
        if file_schema is None:
            file_schema = spark_file_schema(spark, uris[0], source.options)
        extra_fields = [file_schema[name] for name, _ in key]
        rescued.extend(reread_with_extras(spark, uris, schema, extra_fields, source.options))
    drifted = [uri for uris in groups.values() for uri in uris]
    kept = batch.where(~F.col(SOURCE_FILE_COLUMN).isin(drifted))
    return reduce(DataFrame.unionByName, rescued, kept)


def file_columns(
    spark: SparkSession, uri: str, options: Mapping[str, str]
) -> tuple[dict[str, str], StructType | None]:
    """A Parquet file's top-level columns (name to type text), and its Spark schema if Spark read it.

    A ``file:`` URI is read with pyarrow (the footer only, no Spark job); any other URI with
    Spark (one schema job), so object-storage files work wherever Spark can read them.
    """
    path = local_path(uri)
    if path is not None:
        return {f.name: str(f.type) for f in pq.read_schema(path)}, None
    spark_schema = spark_file_schema(spark, uri, options)
    return {f.name: f.dataType.simpleString() for f in spark_schema.fields}, spark_schema


def spark_file_schema(spark: SparkSession, uri: str, options: Mapping[str, str]) -> StructType:
    """The Spark schema of one Parquet file, as Spark infers it (one job)."""
    reader = spark.read.options(**options).option(GLOB_PATHS_OPTION, "false")
    return reader.parquet(hadoop_path(uri)).schema


def reread_with_extras(
    spark: SparkSession,
    uris: list[str],
    schema: StructType,
    extra_fields: list[StructField],
    options: Mapping[str, str],
) -> list[DataFrame]:
    """A batch read of ``uris`` in the stream's shape, ``_rescued_data`` holding ``extra_fields``.

    One read per partition base folder (``basePath``), so partition columns of the stored schema
    (``date=...`` folders) are filled from the path as the stream fills them.
    """
    read_schema = StructType([*schema.fields, *extra_fields])
    by_base: dict[str | None, list[str]] = {}
    recursive = any(
        k.lower() == "recursivefilelookup" and v.lower() == "true" for k, v in options.items()
    )
    for uri in uris:
        path = hadoop_path(uri)
        by_base.setdefault(None if recursive else partition_base(path), []).append(path)
    frames = []
    for base, paths in by_base.items():
        reader = spark.read.options(**options).option(GLOB_PATHS_OPTION, "false")
        if base is not None:
            reader = reader.option("basePath", base)
        frame = reader.schema(read_schema).parquet(*paths)
        frames.append(
            frame.select(
                *(F.col(quote(name)) for name in schema.fieldNames()),
                rescued_columns([f.name for f in extra_fields]).alias(RESCUED_COLUMN),
                *metadata_columns(),
            )
        )
    return frames


def rescued_columns(names: list[str]) -> Column:
    """``to_json`` of the columns ``names`` (nulls left out), or null when all of them are null."""
    columns = [F.col(quote(name)).alias(name) for name in names]
    present = reduce(or_, (column.isNotNull() for column in columns))
    return F.when(present, F.to_json(F.struct(*columns), {"ignoreNullFields": "true"}))


def extra_columns(file_columns: list[str], schema: StructType, case_sensitive: bool) -> list[str]:
    """The columns of a file that the stored schema lacks, in file order, as Spark matches them."""
    if case_sensitive:
        known = set(schema.fieldNames())
        return [name for name in file_columns if name not in known]
    known = {name.lower() for name in schema.fieldNames()}
    return [name for name in file_columns if name.lower() not in known]


def local_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI as Spark reports it (percent-decoded); else None."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(unquote(parts.path))


def hadoop_path(uri: str) -> str:
    """A file URI as Spark reports it (``a%20b``) as the path string Spark's reader takes."""
    parts = urlsplit(uri)
    authority = f"//{parts.netloc}" if parts.netloc else ""
    return f"{parts.scheme}:{authority}{unquote(parts.path)}" if parts.scheme else unquote(uri)


def partition_base(path: str) -> str | None:
    """The folder above the ``key=value`` folders holding ``path``, or None if there are none.

    ``file:/landing/date=2024-01-01/h=3/a.parquet`` gives ``file:/landing``.
    """
    folder, _, _ = path.rpartition("/")
    base = folder
    while "=" in base.rpartition("/")[2]:
        base = base.rpartition("/")[0]
    return base if base != folder else None


# --- column rules ----------------------------------------------------------------------------


def metadata_columns() -> list[Column]:
    """``source_file`` and ``source_modified_at`` from Spark's hidden ``_metadata`` column."""
    metadata = F.col(_METADATA)
    return [
        metadata.getField("file_path").alias(SOURCE_FILE_COLUMN),
        metadata.getField("file_modification_time").alias(SOURCE_MODIFIED_COLUMN),
    ]


def quote(name: str) -> str:
    """``name`` as a backquoted column reference, so dots or spaces in it are taken literally."""
    return "`" + name.replace("`", "``") + "`"


def corrupt_record(raw: Column) -> Column:
    """``{"_corrupt_record": raw}`` as a JSON string."""
    return F.to_json(F.create_map(F.lit(CORRUPT_RECORD), raw))


def json_rescued_data(line: Column, raw: Column, typed: Column, schema: StructType) -> Column:
    """``_rescued_data`` of a JSON line: the corrupt line, the rescued fields, or null."""
    rescued = rescued_fields(raw, typed, schema)
    return F.when(raw.isNull(), corrupt_record(line)).when(F.size(rescued) > 0, F.to_json(rescued))


def rescued_fields(raw: Column, typed: Column, schema: StructType) -> Column:
    """The entries of the ``raw`` map that are not in the schema or not held by ``typed``.

    The map is filtered, never rebuilt, so a line with a duplicated key cannot fail the query.
    """
    names = schema.fieldNames()
    lost_by_name = F.create_map(
        *chain.from_iterable(
            (F.lit(f.name), is_lost(raw.getItem(f.name), typed.getField(f.name), f.dataType))
            for f in schema.fields
        )
    )
    return F.map_filter(
        raw, lambda key, _: ~key.isin(names) | F.coalesce(lost_by_name[key], F.lit(False))
    )


def is_lost(raw: Column, typed: Column, data_type: DataType) -> Column:
    """Whether the raw JSON text of a value holds something its typed value does not."""
    missing = raw.isNotNull() & typed.isNull()
    if isinstance(data_type, StructType):
        return missing | (typed.isNotNull() & _struct_loses(raw, typed, data_type))
    if isinstance(data_type, ArrayType):
        return missing | (typed.isNotNull() & _array_loses(raw, typed, data_type))
    return missing


def _struct_loses(raw: Column, typed: Column, data_type: StructType) -> Column:
    """A nested object has a key the struct lacks, or a field whose value was lost."""
    members = F.from_json(raw, RAW_MAP)
    names = data_type.fieldNames()
    unknown = F.exists(F.map_keys(members), lambda key: ~key.isin(names))
    lost = [is_lost(members.getItem(f.name), typed.getField(f.name), f.dataType) for f in data_type]
    return F.coalesce(reduce(or_, lost, unknown), F.lit(False))


def _array_loses(raw: Column, typed: Column, data_type: ArrayType) -> Column:
    """A nested array has an element whose value was lost."""
    items = F.from_json(raw, ArrayType(StringType()))
    element_type = data_type.elementType
    lost = F.zip_with(items, typed, lambda item, value: is_lost(item, value, element_type))
    return F.coalesce(F.exists(lost, lambda flag: flag), F.lit(False))

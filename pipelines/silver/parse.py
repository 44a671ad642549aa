"""Parsing bronze records into silver events, and everything that cannot be parsed into quarantine.

:func:`parse_batch` turns one micro-batch of bronze rows (raw Kafka ``key`` / ``value`` bytes and
their coordinates) into one DataFrame in which every row is a silver event, a quarantined record
(with its :data:`REASONS`) or an ignored Debezium tombstone (:data:`IGNORED`). It is a single
projection: no row is read twice and nothing is collected; the stage holds it and splits it.

Checks, in order, each adding its reason (the first that fails decides what the later ones see):

1. the value is valid UTF-8 (checked on the bytes: a cast to string would silently replace them);
2. the value is JSON, and a JSON object;
3. it matches the declared schema (Spark's ``from_json`` in PERMISSIVE mode fills a corrupt-record
   column when a value does not fit its declared type; the columns at fault are named);
4. for Debezium: the op is one of c, u, d, r, and the row image the op needs (``after`` for c/u/r,
   ``before`` for d) is present;
5. the key columns and the sequence value are not null.

Formats:

``json``
    The value is a JSON object with the schema's columns. A *tombstone* (a record whose value is
    null, as in a compacted topic) deletes its key: the key columns are read from the Kafka key,
    a JSON object (``{"id": 7}``) or, for a single key column, its text (``7``). A declared
    ``delete_when`` condition marks other deletes. ``_op`` is ``u`` (an upsert) or ``d``.
``debezium``
    Debezium's change-event envelope (``before``, ``after``, ``op``, ``ts_ms``, ``source``), bare or
    wrapped in ``{"schema": ..., "payload": ...}`` by the JSON converter. ``_source_lsn`` is the
    change's log position (``source.lsn``: Postgres; other connectors' positions, such as MySQL's
    binlog file and ``pos``, do not order changes by themselves, so declare ``sequence_by``) and
    ``_source_ts_ms`` its commit time in the source database. A tombstone after a delete carries
    no position and is ignored (:data:`IGNORED`): the delete already happened, at its own position.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines.catalog.lifecycle import ddl_struct
from pipelines.silver import debezium
from pipelines.spec import QUARANTINE_TABLE_COLUMNS, SilverSpec

REASONS = "_reasons"
#: How a quarantine reason for a value of another type than declared starts: a non-additive
#: schema change upstream (a column's type changed) shows as rows with it.
SCHEMA_MISMATCH = "value does not match the declared schema: "
#: True for a row that is neither an event nor quarantined: a Debezium tombstone (the delete
#: happened at its own position), counted so that a batch's rows all add up.
IGNORED = "_ignored"
CORRUPT = "_corrupt_record"
DEBEZIUM_OPS = ("c", "u", "d", "r")
#: Debezium's op of a TRUNCATE: no key, no row image; applied per ``silver.debezium.truncate``.
TRUNCATE = "t"
#: The columns of a parsed row whose value Debezium did not send (an unchanged TOASTed value:
#: its placeholder), null until :mod:`pipelines.silver.changes` carries the stored value forward.
UNAVAILABLE = "_unavailable"
#: Columns every silver event carries after the schema's own, in order (see docs/silver.md).
EVENT_METADATA = (
    "_op",
    "_sequence",
    "_event_time",
    "_event_date",
    "_source_topic",
    "_source_partition",
    "_source_offset",
    "_source_timestamp",
    "_source_ts_ms",
    "_source_lsn",
    "_ingested_at",
    "_batch_id",
)
#: Columns the parser keeps beside the row's (a record field of these names cannot evolve).
PARSER_COLUMNS = ("raw_key", "raw_value", REASONS, IGNORED, UNAVAILABLE)
#: The quarantine table's columns, in order.
QUARANTINE_COLUMNS = QUARANTINE_TABLE_COLUMNS
_ENVELOPE_FIELDS = ("before", "after", "op", "ts_ms", "source")
_SOURCE_STRUCT = "ts_ms BIGINT, lsn BIGINT, snapshot STRING, db STRING, table STRING"


def _permissive(schema: StructType) -> dict[str, str]:
    return {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}


def _with_corrupt(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField(CORRUPT, StringType())])


def envelope_schema(row: StructType) -> StructType:
    """The Debezium envelope with ``row`` as its before/after image, bare or under ``payload``."""
    fields = [
        StructField("before", row),
        StructField("after", row),
        StructField("op", StringType()),
        StructField("ts_ms", LongType()),
        StructField("source", ddl_struct(_SOURCE_STRUCT)),
    ]
    return StructType([*fields, StructField("payload", StructType(fields))])


def _reason_when(condition: Column, message: Column | str) -> Column:
    text = message if isinstance(message, Column) else F.lit(message)
    return F.when(condition, text)


def _mismatched_columns(text: Column, row: StructType, parsed: Column, prefix: str) -> Column:
    """Names of the columns whose JSON value is present but did not fit its declared type."""
    names = [
        F.when(
            F.get_json_object(text, f"$.{prefix}{field.name}").isNotNull()
            & parsed[field.name].isNull(),
            F.lit(f"{prefix}{field.name} ({field.dataType.simpleString()})"),
        )
        for field in row.fields
    ]
    return F.nullif(F.concat_ws(", ", *names), F.lit(""))


#: Epoch milliseconds Spark's timestamps can hold (years 1 to 9999); others would overflow.
_MILLIS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)


def _timestamp_millis(millis: Column) -> Column:
    """``timestamp_millis`` that gives null instead of failing the batch on an absurd value."""
    return F.when(millis.between(*_MILLIS_RANGE), F.timestamp_millis(millis))


def _parse_failure(text: Column, utf8_ok: Column, parsed: Column, mismatch: Column) -> Column:
    """Why a value did not parse, or null. ``parsed`` is ``from_json`` of it with a corrupt-record
    column; the costlier checks run only for the few values that did not parse (CASE branches
    are evaluated lazily, row by row)."""
    return (
        F.when(~utf8_ok, F.lit("value is not valid UTF-8"))
        .when(parsed.isNull(), F.lit("value is not valid JSON"))  # blank
        .when(parsed[CORRUPT].isNull(), F.lit(None).cast("string"))
        .when(F.try_parse_json(text).isNull(), F.lit("value is not valid JSON"))
        .when(~F.ltrim(text).startswith("{"), F.lit("value is JSON but not a JSON object"))
        .otherwise(
            F.concat(
                F.lit(SCHEMA_MISMATCH),
                F.coalesce(mismatch, F.lit("a value of another type")),
            )
        )
    )


def _decoded_image(
    row: StructType, spec: SilverSpec, present: Column, op: Column, reasons: list[Column]
) -> tuple[dict[str, Column], list[Column], Column]:
    """The Debezium row image (``_image``, read by :func:`debezium.wire_row`) decoded into the
    declared types (:mod:`pipelines.silver.debezium`), ``reasons`` with one more: values that
    did not decode, and whether every value decoded (true implies that reason is null; a TOAST
    placeholder counts as decoded). A TOAST placeholder decodes to null; :data:`UNAVAILABLE`
    names its column, and :mod:`pipelines.silver.changes` carries the key's stored value
    forward into it."""
    image, encodings = F.col("_image"), F.col("_encodings")
    decoded = {
        f.name: F.when(
            ~debezium.unavailable(image[f.name].cast("string")),
            debezium.decode(f, image[f.name], encodings[f.name], spec.debezium),
        )
        for f in row.fields
    }
    wrapped = F.when(F.col("_env.payload").isNotNull(), F.lit("payload.")).otherwise(F.lit(""))
    side = F.concat(wrapped, F.when(op == "d", F.lit("before")).otherwise(F.lit("after")))
    all_decoded = F.lit(True)
    for f in row.fields:
        all_decoded = all_decoded & debezium.decoded_as_sent(image[f.name], decoded[f.name])
    # Where a value did not decode, mismatch names it: the list is never empty there.
    failed = F.concat_ws(
        ", ", *(debezium.mismatch(f, image[f.name], decoded[f.name], side) for f in row.fields)
    )
    reasons = [
        *reasons,
        _reason_when(present & ~all_decoded, F.concat(F.lit(SCHEMA_MISMATCH), failed)),
    ]
    return decoded, reasons, all_decoded


@dataclass(frozen=True)
class _Columns:
    """What one format's parse makes of a bronze row, before the common metadata."""

    values: list[Column]
    op: Column
    ts_ms: Column
    lsn: Column
    default_event_time: Column
    reasons: list[Column]
    #: True only for a row none of ``reasons`` applies to: a cheap test, so that the reasons'
    #: own expressions (messages, names of the columns at fault) run for the other rows only.
    clean: Column
    ignored: Column
    unavailable: Column


def _envelope(frame: DataFrame, wire: StructType, value_text: Column, utf8_ok: Column) -> DataFrame:
    """``frame`` with the Debezium envelope parsed (``_env``) and its payload, bare or wrapped
    (``_payload``), and ``_parse_failure``: why the value is not an envelope of ``wire``."""
    envelope = F.from_json(
        F.when(utf8_ok, value_text), _with_corrupt(envelope_schema(wire)), _permissive(wire)
    )
    frame = frame.withColumn("_env", envelope)
    bare = F.struct(*(F.col(f"_env.{name}").alias(name) for name in _ENVELOPE_FIELDS))
    env = F.when(F.col("_env.payload").isNotNull(), F.col("_env.payload")).otherwise(bare)
    frame = frame.withColumn("_payload", env)
    mismatch_names = F.nullif(
        F.concat_ws(
            ", ",
            *(
                _mismatched_columns(value_text, wire, F.col(f"_payload.{side}"), f"{prefix}{side}.")
                for prefix in ("", "payload.")
                for side in ("after", "before")
            ),
        ),
        F.lit(""),
    )
    return frame.withColumn(
        "_parse_failure", _parse_failure(value_text, utf8_ok, F.col("_env"), mismatch_names)
    )


def _op_reasons(op: Column, image: Column, parsed_ok: Column, spec: SilverSpec) -> list[Column]:
    """Why a parsed envelope's op cannot be applied: none, unknown, a missing row image, or a
    TRUNCATE (``op = t``) the spec does not apply (``silver.debezium.truncate``)."""
    known = (*DEBEZIUM_OPS, TRUNCATE)
    reasons = [
        _reason_when(parsed_ok & op.isNull(), "Debezium envelope has no op"),
        _reason_when(
            parsed_ok & op.isNotNull() & ~op.isin(*known),
            F.concat(F.lit("unknown Debezium op '"), op, F.lit("' (known: c, u, d, r, t)")),
        ),
        _reason_when(
            parsed_ok & op.isin(*DEBEZIUM_OPS) & image.isNull(),
            F.concat(
                F.lit("Debezium op '"),
                op,
                F.lit("' has no "),
                F.when(op == "d", F.lit("before")).otherwise(F.lit("after")),
                F.lit(" image"),
            ),
        ),
    ]
    if spec.debezium.truncate != "apply":
        reasons.append(
            _reason_when(
                parsed_ok & (op == TRUNCATE),
                "a TRUNCATE of the table (Debezium op 't'), and silver.debezium.truncate is "
                "quarantine: set it to apply to delete the current rows and close the history "
                "at it, or leave t in the connector's skipped.operations",
            )
        )
    return reasons


def _value() -> tuple[Column, Column, Column]:
    """The record's value as text, whether its bytes are valid UTF-8 (checked on the bytes: a
    cast replaces invalid ones), and whether it is a tombstone (no value)."""
    text = F.col("value").cast("string")
    return text, F.is_valid_utf8(text), F.col("value").isNull()


def _debezium_columns(
    frame: DataFrame, spec: SilverSpec, row: StructType
) -> tuple[DataFrame, _Columns]:
    """The ``debezium`` format's parse (module doc): envelope, op, decoded row image."""
    value_text, utf8_ok, is_tombstone = _value()
    wire = debezium.wire_row(row)  # decimals, timestamps...: as text, decoded below
    frame = _envelope(frame, wire, value_text, utf8_ok)
    op = F.col("_payload.op")
    image = F.when(op == "d", F.col("_payload.before")).otherwise(F.col("_payload.after"))
    parsed_ok = F.col("_parse_failure").isNull()
    reasons: list[Column] = [F.col("_parse_failure"), *_op_reasons(op, image, parsed_ok, spec)]
    # Only the JSON converter's wrapped form ({"schema": ..., "payload": ...}) has a schema to
    # read: a bare envelope is not searched for one (~10 % of a parse, bench/HISTORY.md), and a
    # "schema" beside a bare envelope (Debezium writes none) is not read.
    wrapped = F.col("_env.payload").isNotNull()
    encodings = (
        F.when(wrapped, debezium.column_encodings(value_text))
        if debezium.needs_encodings(row)
        else debezium.no_encodings()
    )
    frame = frame.withColumn("_image", image).withColumn("_encodings", encodings)
    frame = debezium.with_exact_decimals(frame, row, spec.debezium)
    decoded, reasons, all_decoded = _decoded_image(
        row, spec, parsed_ok & image.isNotNull(), op, reasons
    )
    ts_ms = F.col("_payload.source.ts_ms")
    return frame, _Columns(
        values=[decoded[f.name].alias(f.name) for f in row.fields],
        op=op,
        ts_ms=ts_ms,
        lsn=F.col("_payload.source.lsn"),
        default_event_time=F.coalesce(
            _timestamp_millis(ts_ms), _timestamp_millis(F.col("_payload.ts_ms"))
        ),
        # A tombstone is kept as an ignored row, so a batch's rows all show up in its counts.
        reasons=[F.when(~is_tombstone, reason) for reason in reasons],
        # A TRUNCATE (no image) is not cleared here: its reasons decide.
        clean=is_tombstone | (parsed_ok & op.isin(*DEBEZIUM_OPS) & image.isNotNull() & all_decoded),
        ignored=is_tombstone,
        unavailable=debezium.unavailable_columns(row, F.col("_image")),
    )


def _json_columns(
    frame: DataFrame, spec: SilverSpec, row: StructType
) -> tuple[DataFrame, _Columns]:
    """The ``json`` format's parse (module doc): the value's columns; a tombstone's key."""
    value_text, utf8_ok, is_tombstone = _value()
    parsed = F.from_json(F.when(utf8_ok, value_text), _with_corrupt(row), _permissive(row))
    frame = frame.withColumn("_parsed", parsed)
    mismatch_names = _mismatched_columns(value_text, row, F.col("_parsed"), "")
    failure = _parse_failure(value_text, utf8_ok, F.col("_parsed"), mismatch_names)
    keys = spec.current.keys if spec.current else ()
    key_fields = [row[name] for name in keys]
    key_text = F.col("key").cast("string")
    key_struct = F.from_json(key_text, StructType(key_fields)) if key_fields else None
    values = []
    for field in row.fields:
        value = F.col("_parsed")[field.name]
        if key_struct is not None and field.name in keys:
            from_key = key_struct[field.name]
            if len(key_fields) == 1:  # the key is the bare value: 7, "abc" or abc
                scalar = F.try_variant_get(
                    F.try_parse_json(key_text), "$", field.dataType.simpleString()
                )
                from_key = F.coalesce(from_key, scalar, key_text.try_cast(field.dataType))
            value = F.when(is_tombstone, from_key).otherwise(value)
        values.append(value.alias(field.name))
    return frame, _Columns(
        values=values,
        op=F.when(is_tombstone, F.lit("d")).otherwise(F.lit("u")),
        ts_ms=F.lit(None).cast("long"),
        lsn=F.lit(None).cast("long"),
        default_event_time=F.col("kafka_timestamp"),
        reasons=[F.when(~is_tombstone, failure)],
        clean=is_tombstone | failure.isNull(),
        ignored=F.lit(False),
        unavailable=F.array().cast("array<string>"),
    )


def parse_batch(batch: DataFrame, spec: SilverSpec, batch_id: int) -> DataFrame:
    """Parse bronze rows into silver events; failed rows keep their bytes and gain reasons.

    The result has the schema's columns, :data:`EVENT_METADATA`, ``raw_key`` / ``raw_value``,
    :data:`REASONS`, :data:`IGNORED` (Debezium tombstones: no reasons, and no event) and
    :data:`UNAVAILABLE` (the columns a TOAST placeholder left null).
    """
    row = ddl_struct(spec.schema_ddl)
    parse = _debezium_columns if spec.format == "debezium" else _json_columns
    frame, parsed_columns = parse(batch, spec, row)
    frame = frame.select(
        *parsed_columns.values,
        parsed_columns.op.alias("_op"),
        parsed_columns.ts_ms.alias("_source_ts_ms"),
        parsed_columns.lsn.alias("_source_lsn"),
        F.col("topic").alias("_source_topic"),
        F.col("partition").alias("_source_partition"),
        F.col("offset").alias("_source_offset"),
        F.col("kafka_timestamp").alias("_source_timestamp"),
        F.col("ingested_at").alias("_ingested_at"),
        parsed_columns.default_event_time.alias("_default_event_time"),
        F.col("key").alias("raw_key"),
        F.col("value").alias("raw_value"),
        _reasons_unless(parsed_columns.clean, parsed_columns.reasons).alias(REASONS),
        parsed_columns.ignored.alias(IGNORED),
        parsed_columns.unavailable.alias(UNAVAILABLE),
    )
    # The spec's own expressions see parsed rows only: on a record that did not parse they could
    # fail (ANSI casts) and stop the stream instead of quarantining it.
    parsed = parsed_event()
    if spec.format == "json" and spec.delete_condition:
        deleted = F.when(parsed, F.expr(spec.delete_condition))
        frame = frame.withColumn(
            "_op", F.when(F.coalesce(deleted, F.lit(False)), F.lit("d")).otherwise(F.col("_op"))
        )
    event_time = (
        F.coalesce(F.col(spec.event_time).try_cast("timestamp"), F.col("_default_event_time"))
        if spec.event_time
        else F.col("_default_event_time")
    )
    frame = (
        frame.withColumn("_sequence", F.when(parsed, F.expr(spec.sequence_expression)))
        .withColumn("_event_time", F.coalesce(event_time, F.col("_source_timestamp")))
        .withColumn("_event_date", F.to_date("_event_time"))
        .drop("_default_event_time")
    )
    frame = with_batch_id(frame, batch_id)
    return frame.withColumn(REASONS, _with_row_reasons(spec))


def _reasons_unless(clean: Column, reasons: list[Column]) -> Column:
    """The non-null ``reasons`` as an array; an empty one, without evaluating them, where
    ``clean``. Most rows parse: this keeps the reasons' expressions (their messages, the names
    of the columns at fault, the array filtered of nulls) off their path, ~10 % of a Debezium
    parse (bench/HISTORY.md, "sixteenth session")."""
    found = F.filter(F.array(*reasons), lambda r: r.isNotNull())
    return F.when(clean, F.array().cast("array<string>")).otherwise(found)


def with_batch_id(frame: DataFrame, batch_id: int) -> DataFrame:
    """``frame`` (parsed) stamped with the micro-batch it was parsed in (``_batch_id``): the only
    column of a parse that is not the same in every batch."""
    return frame.withColumn("_batch_id", F.lit(batch_id).cast("long"))


def bronze_rows_of(parsed: DataFrame) -> DataFrame:
    """The bronze rows a :func:`parse_batch` output came from (bytes and coordinates), so that a
    cached parsed batch can be parsed again without reading its source a second time (a second
    read would also count its rows twice in the query's progress)."""
    return parsed.select(
        F.col("raw_key").alias("key"),
        F.col("raw_value").alias("value"),
        F.col("_source_topic").alias("topic"),
        F.col("_source_partition").alias("partition"),
        F.col("_source_offset").alias("offset"),
        F.col("_source_timestamp").alias("kafka_timestamp"),
        F.col("_ingested_at").alias("ingested_at"),
    )


def parsed_event() -> Column:
    """A row that parsed so far (no reason yet) and is not an ignored Debezium tombstone: after
    :func:`parse_batch`, a silver event."""
    return (F.size(F.col(REASONS)) == 0) & ~F.col(IGNORED)


def _with_row_reasons(spec: SilverSpec) -> Column:
    """:data:`REASONS` with the reasons about a parsed row added: a missing key, a null sequence
    (only once the row parsed)."""
    keys = [
        *(spec.current.keys if spec.current else ()),
        *(spec.history_keys if spec.history else ()),
    ]
    if not keys:
        return F.col(REASONS)
    parsed = parsed_event()
    keyed = parsed & (F.col("_op") != TRUNCATE)  # a TRUNCATE has no key: all rows
    checks = [
        _reason_when(keyed & F.col(key).isNull(), f"missing key column {key}")
        for key in dict.fromkeys(keys)
    ]
    checks.append(
        _reason_when(
            parsed & F.col("_sequence").isNull(),
            f"sequence value is null (sequence_by: {spec.sequence_expression})",
        )
    )
    truncate = F.coalesce(F.col("_op") == TRUNCATE, F.lit(False))
    has_keys = F.lit(True)
    for key in dict.fromkeys(keys):
        has_keys = has_keys & F.col(key).isNotNull()
    # The cheap test first: a row that did not parse gets none of these, nor one with its keys
    # (or a TRUNCATE) and a sequence.
    clean = ~parsed | ((truncate | has_keys) & F.col("_sequence").isNotNull())
    found = F.filter(F.array(*checks), lambda r: r.isNotNull())
    return F.when(clean, F.col(REASONS)).otherwise(F.concat(F.col(REASONS), found))


def events_of(parsed: DataFrame, spec: SilverSpec) -> DataFrame:
    """The parsed rows that are silver events, in the events table's column order."""
    names = [*spec.columns(), *EVENT_METADATA]
    return parsed.where(parsed_event()).select(*names)


def quarantine_of(parsed: DataFrame, flow: str) -> DataFrame:
    """The parsed rows that failed, in the quarantine table's shape."""
    return parsed.where(F.size(REASONS) > 0).select(
        F.lit(flow).alias("flow"),
        F.col("_batch_id").alias("batch_id"),
        F.col("_source_topic").alias("topic"),
        F.col("_source_partition").alias("partition"),
        F.col("_source_offset").alias("offset"),
        F.col("_source_timestamp").alias("kafka_timestamp"),
        "raw_key",
        "raw_value",
        F.col(REASONS).alias("reasons"),
        F.current_timestamp().alias("quarantined_at"),
    )

"""Debezium's encodings of column values, decoded into the spec's declared types.

Debezium's JSON converter does not write a ``numeric(12,2)`` as ``12.50`` or a ``timestamp`` as a
date: it writes what the Kafka Connect type says (documented per connector, e.g. PostgreSQL's
"Data type mappings"):

- ``DECIMAL``: with ``decimal.handling.mode=precise`` (the default) the unscaled value's
  two's-complement big-endian bytes, base64-encoded, the scale in the record's schema
  (``org.apache.kafka.connect.data.Decimal``, parameter ``scale``); a ``numeric`` without a
  declared scale as ``{"scale": 3, "value": "<base64>"}`` (``io.debezium.data.VariableScaleDecimal``);
  with ``string`` / ``double`` the text / a JSON number;
- ``TIMESTAMP``: a ``timestamptz`` as an ISO 8601 string (``io.debezium.time.ZonedTimestamp``); a
  ``timestamp`` as epoch micro- (``MicroTimestamp``), milli- (``Timestamp``, Kafka Connect's
  ``Timestamp``) or nanoseconds (``NanoTimestamp``), by column precision and
  ``time.precision.mode``;
- ``DATE``: epoch days (``io.debezium.time.Date``, Kafka Connect's ``Date``);
- ``BINARY``: base64 (``binary.handling.mode`` ``bytes`` or ``base64``) or hexadecimal (``hex``);
- ``BIGINT`` holding an ``interval``: with ``interval.handling.mode=numeric`` (the default) epoch
  microseconds (``io.debezium.time.MicroDuration``, Debezium's own approximation: a month is
  30.4375 days); with ``string`` an ISO 8601 duration written out in full
  (``P1Y2M3DT4H5M6.78S``, each part signed, ``io.debezium.time.Interval``), converted here
  exactly when it has no months or years (a day is 24 hours, as in the numeric mode);
- ``money``: as a ``numeric`` by ``decimal.handling.mode``, the scale ``money.fraction.digits``;
- ``MAP``: an ``hstore`` is a JSON object (``hstore.handling.mode=map``) or a string holding one
  (``json``, the default): read as text, both are the object's JSON text;
- a TOASTed column an UPDATE left unchanged: not its value but a placeholder
  (:data:`UNAVAILABLE`; base64 of it for bytes, a one-element array for arrays).

So the row images are read with every declared column as text (:func:`wire_row`: Spark's JSON
reader keeps a nested object or array as its JSON text), then each column is decoded
(:func:`decode`) by its encoding: the one the record's own schema names (``{"schema",
"payload"}``, :func:`column_encodings`; a bare envelope has none), else the spec's
``silver.debezium`` settings. A value that does not decode is null, and :func:`mismatch` names
it with the setting to check; an exact decimal that does not fit the declared scale is not
rounded: it does not decode.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DateType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pipelines.spec.silver import DebeziumEncoding

#: Debezium's default ``unavailable.value.placeholder``: a TOASTed value an UPDATE did not change.
UNAVAILABLE = "__debezium_unavailable_value"
#: The placeholder of a bytes column: the placeholder's UTF-8 bytes, base64-encoded.
UNAVAILABLE_BASE64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
_UNAVAILABLE_ARRAY = r'^\[\s*"__debezium_unavailable_value"\s*\]$'
#: Kafka Connect / Debezium schema names (``schema.fields[].fields[].name``) by encoding.
DECIMAL_BYTES = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
MILLIS_TIMESTAMPS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICROS_TIMESTAMP = "io.debezium.time.MicroTimestamp"
NANOS_TIMESTAMP = "io.debezium.time.NanoTimestamp"
#: ``schema.fields`` of a Debezium envelope: the before/after images' column schemas.
_SCHEMA_FIELDS = (
    "ARRAY<STRUCT<field: STRING, fields: ARRAY<STRUCT<field: STRING, type: STRING, "
    "name: STRING, parameters: MAP<STRING, STRING>>>>>"
)
#: Debezium's ISO 8601 duration (``interval.handling.mode=string``): years, months, days, then
#: hours, minutes and seconds, each signed on its own (``P0Y0M-1DT2H0M0S`` is -1 day +2 hours).
_ISO_DURATION = (
    r"^P(?:(-?[0-9]+)Y)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+)D)?"
    r"(?:T(?:(-?[0-9]+)H)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+(?:\.[0-9]{1,9})?)S)?)?$"
)
#: Why an ISO 8601 interval with months or years is not a BIGINT of microseconds.
_CALENDAR_INTERVAL = (
    "interval.handling.mode=string sent months or years, which have no fixed length in "
    "microseconds: declare the column STRING for the ISO 8601 text"
)
#: Types read as text and decoded here; the others (numbers, booleans, strings) as JSON has them.
#: BIGINT is read as text for ``interval.handling.mode=string``'s ISO 8601 durations.
_DECODED = (
    DecimalType,
    LongType,
    TimestampType,
    TimestampNTZType,
    DateType,
    BinaryType,
    ArrayType,
    MapType,
    StructType,
)


#: The connector setting that decides how a declared type is encoded, named in a failure.
_SETTINGS: tuple[tuple[type[DataType] | tuple[type[DataType], ...], str], ...] = (
    (DecimalType, "decimal.handling.mode"),
    ((TimestampType, TimestampNTZType, DateType), "time.precision.mode"),
    (BinaryType, "binary.handling.mode"),
)


def wire_type(data_type: DataType) -> DataType:
    """How a declared column is read from a row image: text when it needs decoding."""
    return StringType() if isinstance(data_type, _DECODED) else data_type


def wire_row(row: StructType) -> StructType:
    """The row image's schema with each column as it is read (:func:`wire_type`)."""
    return StructType([StructField(f.name, wire_type(f.dataType)) for f in row.fields])


def column_encodings(value_text: Column) -> Column:
    """Per column of the record's row images, its schema (``type``, ``name``, ``parameters``),
    from the record's own ``schema`` block: a map, null when the record has none."""
    fields = F.from_json(F.get_json_object(value_text, "$.schema.fields"), _SCHEMA_FIELDS)
    image = F.filter(fields, lambda f: f["field"].isin("after", "before"))[0]["fields"]
    return F.map_from_entries(F.transform(image, lambda f: F.struct(f["field"], f)))


def unavailable(text: Column) -> Column:
    """Whether ``text`` (a column read as text) is the TOAST placeholder, in any of its forms."""
    return text.isin(UNAVAILABLE, UNAVAILABLE_BASE64) | text.rlike(_UNAVAILABLE_ARRAY)


def decode(field: StructField, text: Column, encoding: Column, mode: DebeziumEncoding) -> Column:
    """``text`` (:func:`wire_row`'s) as ``field``'s declared type; null when it does not decode.
    ``encoding``: the column's schema from the record (:func:`column_encodings`), or null."""
    data_type, name = field.dataType, encoding["name"]
    if isinstance(data_type, DecimalType):  # prepared by with_exact_decimals
        return _decimal(F.col(exact_column(field.name)), data_type)
    if isinstance(data_type, TimestampType | TimestampNTZType):
        return _timestamp(text, data_type, name, mode)
    if isinstance(data_type, DateType):
        days = F.when(text.rlike("^-?[0-9]+$"), F.date_add(F.lit("1970-01-01"), text.cast("int")))
        return F.coalesce(days, text.try_cast("date"))
    if isinstance(data_type, LongType):
        number = F.when(text.rlike("^-?[0-9]+$"), text.try_cast("long"))  # "1.5" would truncate
        return F.coalesce(number, F.when(text.startswith("P"), _micros_of(text)))
    if isinstance(data_type, BinaryType):
        return F.try_to_binary(
            text, F.lit("hex" if mode.binary_handling_mode == "hex" else "base64")
        )
    if isinstance(data_type, ArrayType | StructType):
        return F.from_json(text, data_type)
    if isinstance(data_type, MapType):
        return F.from_json(text, data_type.simpleString())
    return text


def _timestamp(text: Column, data_type: DataType, name: Column, mode: DebeziumEncoding) -> Column:
    """Epoch micro-, milli- or nanoseconds by the schema's name (else the declared mode), or an
    ISO 8601 string (``ZonedTimestamp``). Spark's session time zone is UTC (pipelines/spark.py),
    so an epoch value read as a TIMESTAMP_NTZ keeps the wall-clock time it stands for."""
    declared_micros = mode.time_precision_mode != "connect"
    epoch = text.try_cast("long")
    micros = (
        F.when(name.isin(*MILLIS_TIMESTAMPS), epoch * 1000)
        .when(name == MICROS_TIMESTAMP, epoch)
        .when(name == NANOS_TIMESTAMP, F.floor(epoch / 1000))
        .when(name.isNull(), epoch if declared_micros else epoch * 1000)
    )
    instant = F.when(text.rlike("^-?[0-9]+$"), F.timestamp_micros(micros))
    return F.coalesce(instant.cast(data_type), text.try_cast(data_type))


def _micros_of(duration: Column) -> Column:
    """The microseconds of Debezium's ISO 8601 ``duration`` (``interval.handling.mode=string``);
    null when it is not one, does not fit a BIGINT, or has months or years: those have no fixed
    length, and guessing one (Debezium's numeric mode takes 30.4375 days) would write a number
    the database never held. A day is 24 hours, as the numeric mode counts it. Every step is
    exact: the seconds as a decimal (at most 9 fraction digits, Debezium's), the rest in BIGINT
    arithmetic whose overflow is null, not an ANSI error that would fail the batch."""

    def part(group: int) -> Column:
        text = F.regexp_extract(duration, _ISO_DURATION, group)
        return F.when(text == "", F.lit(0).cast("long")).otherwise(text.try_cast("long"))

    months = F.try_add(F.try_multiply(part(1), F.lit(12)), part(2))
    hours = F.try_add(F.try_multiply(part(3), F.lit(24)), part(4))
    minutes = F.try_add(F.try_multiply(hours, F.lit(60)), part(5))
    whole = F.try_multiply(F.try_multiply(minutes, F.lit(60)), F.lit(1_000_000))
    seconds = F.regexp_extract(duration, _ISO_DURATION, 6)
    exact = F.when(seconds == "", F.lit("0")).otherwise(seconds).try_cast("decimal(29,9)")
    fraction = exact * F.lit(1_000_000).cast("decimal(7,0)")  # decimal(37,9): never overflows
    micros = F.when(fraction == F.floor(fraction), fraction.try_cast("long"))
    return F.when(
        duration.rlike(_ISO_DURATION) & (months == 0) & duration.rlike("[0-9]"),
        F.try_add(whole, micros),
    )


def _calendar_interval(text: Column) -> Column:
    """Whether ``text`` is an ISO 8601 duration with months or years (:func:`_micros_of`)."""
    months = [F.regexp_extract(text, _ISO_DURATION, g) for g in (1, 2)]
    return text.rlike(_ISO_DURATION) & (months[0].rlike("[1-9]") | months[1].rlike("[1-9]"))


def exact_column(name: str) -> str:
    """The helper column :func:`with_exact_decimals` adds for DECIMAL column ``name``."""
    return f"_exact_{name}"


def with_exact_decimals(frame: DataFrame, row: StructType, mode: DebeziumEncoding) -> DataFrame:
    """``frame`` (with ``_image`` and ``_encodings``) with, per DECIMAL column, its value written
    out exactly as text (:func:`exact_column`), from any of Debezium's decimal encodings (module
    doc); null when it does not decode. Each step is a column of its own, so Spark computes the
    bytes' integer once per value instead of once per use."""
    decimals = [f for f in row.fields if isinstance(f.dataType, DecimalType)]
    if not decimals:
        return frame
    steps: list[dict[str, Column]] = [{}, {}, {}]
    for field in decimals:
        text, name = F.col("_image")[field.name], F.col("_encodings")[field.name]["name"]
        is_object = F.ltrim(text).startswith("{")
        precise = F.lit(mode.decimal_handling_mode == "precise")
        encoded = F.when(name.isNull(), precise).otherwise(name == DECIMAL_BYTES)
        scale = F.when(is_object, F.get_json_object(text, "$.scale").try_cast("int")).otherwise(
            F.coalesce(
                F.col("_encodings")[field.name]["parameters"]["scale"].try_cast("int"),
                F.lit(_declared_scale(field)),
            )
        )
        value = F.when(is_object, F.get_json_object(text, "$.value")).when(encoded, text)
        plain = F.when(~is_object & ~encoded, text)  # decimal.handling.mode string or double
        prefix = f"_dz_{field.name}"
        steps[0] |= {f"{prefix}_hex": _hex_of_base64(value), f"{prefix}_scale": scale,
                     f"{prefix}_plain": plain}  # fmt: skip
        steps[1] |= {f"{prefix}_unscaled": _unscaled(F.col(f"{prefix}_hex"))}
        steps[2] |= {
            exact_column(field.name): F.coalesce(
                _with_scale(F.col(f"{prefix}_unscaled"), F.col(f"{prefix}_scale")),
                F.col(f"{prefix}_plain"),
            )
        }
    for step in steps:
        frame = frame.withColumns(step)
    return frame


def _declared_scale(field: StructField) -> int:
    assert isinstance(field.dataType, DecimalType)
    return field.dataType.scale


def _decimal(exact: Column, data_type: DecimalType) -> Column:
    """The exact decimal text as ``data_type``; null when it does not fit without rounding."""
    return F.when(_fits(exact, data_type), exact.try_cast(data_type))


def _hex_of_base64(text: Column) -> Column:
    """The bytes of strict base64 ``text`` as hexadecimal; null when it is not base64 (Spark's
    decoder would skip stray characters: ``10.50`` must not read as bytes)."""
    strict = text.rlike("^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
    return F.when(strict & (F.length(text) > 0), F.hex(F.try_to_binary(text, F.lit("base64"))))


def _unscaled(hexes: Column) -> Column:
    """The integer of two's-complement big-endian bytes (Java's ``BigInteger``, here as
    hexadecimal), as text; null beyond 38 digits. Summed hex digit by hex digit in DECIMAL(38,0);
    a negative number as -(its complement + 1), so no sum exceeds the magnitude."""
    negative = F.substring(hexes, 1, 1).isin(*"89ABCDEF")
    digits = F.transform(
        F.split(hexes, ""),
        lambda d: F.when(negative, 15 - F.conv(d, 16, 10).cast("int")).otherwise(
            F.conv(d, 16, 10).cast("int")
        ),
    )
    zero = F.lit(0).cast("decimal(38,0)")
    total = F.aggregate(
        F.filter(digits, lambda d: d.isNotNull()),
        zero,
        lambda acc, d: F.try_add(F.try_multiply(acc, F.lit(16)), d).cast("decimal(38,0)"),
    )
    value = F.when(negative, -(total + 1)).otherwise(total)
    return F.when(F.length(hexes) > 0, value.cast("string"))


def _with_scale(unscaled: Column, scale: Column) -> Column:
    """``unscaled`` x 10^-``scale`` written out exactly (``-1234``, 2 -> ``-12.34``)."""
    sign = F.when(unscaled.startswith("-"), F.lit("-")).otherwise(F.lit(""))
    magnitude = F.ltrim(unscaled, F.lit("-"))
    digits = F.lpad(magnitude, F.greatest(F.length(magnitude), scale + 1), F.lit("0"))  # lpad cuts
    whole = F.substring(digits, F.lit(1), F.length(digits) - scale)
    fraction = F.substring(digits, F.length(digits) - scale + 1, scale)
    return F.when(scale <= 0, unscaled).otherwise(F.concat(sign, whole, F.lit("."), fraction))


def _fits(exact: Column, data_type: DecimalType) -> Column:
    """Whether the decimal written in ``exact`` keeps its value as ``data_type``: no digit beyond
    the declared scale but zeros (a cast would round them away)."""
    fraction = F.regexp_extract(exact, r"\.([0-9]*)$", 1)
    beyond = F.substring(fraction, data_type.scale + 1, 1000)
    return exact.isNotNull() & (beyond.rlike("^0*$"))


def no_encodings() -> Column:
    """:func:`column_encodings` of a row whose columns need no schema to decode: none."""
    element = F.from_json(F.lit(None).cast("string"), _SCHEMA_FIELDS).getItem(0)["fields"]
    return F.map_from_entries(F.transform(element, lambda f: F.struct(f["field"], f)))


def needs_encodings(row: StructType) -> bool:
    """Whether decoding ``row`` depends on the record's schema (decimals and timestamps do)."""
    kinds = (DecimalType, TimestampType, TimestampNTZType)
    return any(isinstance(field.dataType, kinds) for field in row.fields)


def mismatch(field: StructField, text: Column, decoded: Column, image: Column) -> Column:
    """``<image>.<column> (type)`` when ``text`` is a value that did not decode as ``field``'s
    type, else null; ``image`` names the row image (``after``, ``payload.before``, ...)."""
    described = field.dataType.simpleString()
    setting = next((s for kind, s in _SETTINGS if isinstance(field.dataType, kind)), None)
    if setting is not None:
        described += f"; is silver.debezium.{setting.replace('.', '_')} the connector's {setting}?"
    why = F.lit(f".{field.name} ({described})")
    if isinstance(field.dataType, LongType):
        calendar = F.lit(f".{field.name} ({described}; {_CALENDAR_INTERVAL})")
        why = F.when(_calendar_interval(text), calendar).otherwise(why)
    return F.when(~decoded_as_sent(text, decoded), F.concat(image, why))


def decoded_as_sent(text: Column, decoded: Column) -> Column:
    """Whether ``decoded`` (:func:`decode` of ``text``) holds what was sent: ``text`` is null, or
    the TOAST placeholder, or it decoded. False exactly when :func:`mismatch` names the column."""
    return ~(text.isNotNull() & decoded.isNull() & ~unavailable(text))


def unavailable_columns(row: StructType, image: Column) -> Column:
    """The columns of ``image`` (read by :func:`wire_row`) holding the TOAST placeholder, in
    ``row``'s order: an array, empty when none (or without an image)."""
    named = [F.when(unavailable(image[f.name].cast("string")), F.lit(f.name)) for f in row.fields]
    return F.filter(F.array(*named), lambda name: name.isNotNull())

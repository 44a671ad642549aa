"""Debezium's value encodings decoded into the declared types (``pipelines/silver/debezium.py``),
on records shaped as Debezium 3.6's PostgreSQL connector writes them (``{"schema", "payload"}``
with its field schemas, and the same payloads bare, decoded by ``silver.debezium``): one parse of
one batch on the shared Spark session, no Kafka. The real connector reading a real PostgreSQL is
``test_debezium_source.py`` and ``make demo-cdc``."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

from pyspark.sql import SparkSession

from pipelines.silver.debezium import UNAVAILABLE
from pipelines.silver.parse import REASONS, parse_batch
from pipelines.silver.parse import UNAVAILABLE as UNAVAILABLE_COLUMNS
from pipelines.spec import parse_spec

SCHEMA = (
    "id INT, balance DECIMAL(12,2), exact DECIMAL(10,3), opened_at TIMESTAMP, "
    "created TIMESTAMP_NTZ, born DATE, avatar BINARY, profile STRING, ref STRING, tags ARRAY<STRING>, "
    "wait BIGINT, span STRING, price DECIMAL(19,2), attrs MAP<STRING,STRING>, extras STRING"
)
#: The field schemas Debezium writes for the columns above (PostgreSQL: integer, numeric(12,2),
#: numeric, timestamptz, timestamp, date, bytea, jsonb, uuid, text[], interval, interval, money,
#: hstore, hstore), in the connector's default modes.
FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "12"},
     "field": "balance"},
    {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "scale"},
                                  {"type": "bytes", "optional": False, "field": "value"}],
     "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
     "field": "exact"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1,
     "field": "opened_at"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1,
     "field": "created"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1,
     "field": "born"},
    {"type": "bytes", "optional": True, "field": "avatar"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1,
     "field": "profile"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1,
     "field": "ref"},
    {"type": "array", "items": {"type": "string", "optional": True}, "optional": True,
     "field": "tags"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroDuration", "version": 1,
     "field": "wait"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroDuration", "version": 1,
     "field": "span"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2"}, "field": "price"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1,
     "field": "attrs"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1,
     "field": "extras"},
]  # fmt: skip
#: ``interval.handling.mode=string`` and ``hstore.handling.mode=map``: the other field schemas.
INTERVAL_STRING = {"type": "string", "optional": True, "name": "io.debezium.time.Interval",
                   "version": 1}  # fmt: skip
HSTORE_MAP = {"type": "map", "keys": {"type": "string", "optional": False},
              "values": {"type": "string", "optional": True}, "optional": True}  # fmt: skip
OTHER_MODES = [
    {**INTERVAL_STRING, "field": f["field"]} if f["field"] in ("wait", "span")
    else {**HSTORE_MAP, "field": f["field"]} if f["field"] in ("attrs", "extras")
    else f
    for f in FIELDS
]  # fmt: skip
#: PostgreSQL's ``3 days 04:05:06.78``: Debezium's numeric mode, and its string mode.
THREE_DAYS = 273_906_780_000
THREE_DAYS_ISO = "P0Y0M3DT4H5M6.78S"
#: An hstore in the default ``json`` mode: the JSON text Debezium's generator writes (compact).
HSTORE_JSON = '{"tier":"gold","note":null}'
NOV_20 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)
MICROS = int(NOV_20.timestamp()) * 1_000_000


def unscaled(value: int) -> str:
    """Java's ``BigInteger.toByteArray`` (two's complement, big-endian, shortest), base64."""
    length = max(1, (value + (value < 0)).bit_length() // 8 + 1)
    return base64.b64encode(value.to_bytes(length, "big", signed=True)).decode()


def row(**changes: Any) -> dict[str, Any]:
    values = {
        "id": 1, "balance": unscaled(1050), "exact": {"scale": 3, "value": unscaled(123456)},
        "opened_at": "2026-11-20T10:00:00.000000Z", "created": MICROS,
        "born": (NOV_20.date() - dt.date(1970, 1, 1)).days,
        "avatar": base64.b64encode(b"\x89PNG").decode(), "profile": '{"tier": "gold"}',
        "ref": "00000000-0000-0000-0000-000000000001", "tags": ["a", "b"],
        "wait": THREE_DAYS, "span": THREE_DAYS, "price": unscaled(123456), "attrs": HSTORE_JSON,
        "extras": HSTORE_JSON,
    }  # fmt: skip
    return {**values, **changes}


def envelope(
    after: dict[str, Any],
    *,
    schema: bool = True,
    op: str = "u",
    lsn: int = 100,
    fields: list[dict[str, Any]] = FIELDS,
) -> bytes:
    payload = {
        "before": None, "after": after, "op": op, "ts_ms": 1_700_000_000_000,
        "source": {"lsn": lsn, "ts_ms": 1_700_000_000_000, "txId": 7, "db": "shop",
                   "table": "accounts", "snapshot": "false"},
    }  # fmt: skip
    if not schema:
        return json.dumps(payload).encode()
    image = {
        "type": "struct",
        "fields": fields,
        "optional": True,
        "name": "shop.public.accounts.Value",
    }
    value_schema = {
        "type": "struct", "name": "shop.public.accounts.Envelope",
        "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                   {"type": "string", "optional": False, "field": "op"}],
    }  # fmt: skip
    return json.dumps({"schema": value_schema, "payload": payload}).encode()


def parse(spark: SparkSession, values: list[bytes], **debezium: str) -> list[dict[str, Any]]:
    spec = parse_spec(
        {
            "name": "accounts",
            "source": {"kind": "kafka", "topics": ["shop.public.accounts"]},
            "target": {"table": "bronze_accounts"},
            "silver": {
                "format": "debezium",
                "schema": SCHEMA,
                "debezium": debezium,
                "current": {"table": "accounts", "keys": ["id"]},
            },
        }
    )
    now = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
    batch = spark.createDataFrame(
        [(None, v, "shop.public.accounts", 0, i, now, now) for i, v in enumerate(values)],
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
        "kafka_timestamp TIMESTAMP, ingested_at TIMESTAMP",
    )
    assert spec.silver is not None
    parsed = parse_batch(batch, spec.silver, 0).cache()
    return [r.asDict() for r in parsed.orderBy("_source_offset").collect()]


EXPECTED = {
    "id": 1, "balance": Decimal("10.50"), "exact": Decimal("123.456"),
    "opened_at": NOV_20.replace(tzinfo=None), "created": NOV_20.replace(tzinfo=None),
    "born": NOV_20.date(), "avatar": bytearray(b"\x89PNG"), "profile": '{"tier": "gold"}',
    "ref": "00000000-0000-0000-0000-000000000001", "tags": ["a", "b"],
    "wait": THREE_DAYS, "span": str(THREE_DAYS), "price": Decimal("1234.56"),
    "attrs": {"tier": "gold", "note": None}, "extras": HSTORE_JSON,
}  # fmt: skip


def values_of(parsed: dict[str, Any]) -> dict[str, Any]:
    return {name: parsed[name] for name in EXPECTED}


def test_every_encoding_decodes_by_the_records_own_schema(spark: SparkSession) -> None:
    negative = row(id=2, balance=unscaled(-325), exact={"scale": 0, "value": unscaled(-7)})
    parsed = parse(spark, [envelope(row()), envelope(negative)])
    assert [p[REASONS] for p in parsed] == [[], []]
    assert values_of(parsed[0]) == EXPECTED
    assert (parsed[1]["balance"], parsed[1]["exact"]) == (Decimal("-3.25"), Decimal("-7.000"))


def test_records_without_their_schema_decode_by_the_declared_modes(spark: SparkSession) -> None:
    bare = [envelope(row(), schema=False)]
    assert values_of(parse(spark, bare)[0]) == EXPECTED  # precise, adaptive: the defaults
    as_text = row(balance="10.50", created=MICROS // 1000, price="1234.56")  # money too
    parsed = parse(
        spark,
        [envelope(as_text, schema=False)],
        decimal_handling_mode="string",
        time_precision_mode="connect",
    )
    assert values_of(parsed[0]) == EXPECTED


def test_a_value_the_declared_mode_cannot_read_is_quarantined_naming_column_and_setting(
    spark: SparkSession,
) -> None:
    """A connector on ``decimal.handling.mode=string`` read as ``precise``; a scale wider than
    declared (never rounded); an interval of months as microseconds (never guessed); one beyond
    a BIGINT's microseconds, and a fraction of a second in a BIGINT (never truncated)."""
    months = row(wait="P1Y2M3DT4H5M6.78S", span="P1Y2M3DT4H5M6.78S")
    beyond = row(wait="P0Y0M0DT0H0M9223372036854.775808S")
    parsed = parse(
        spark,
        [
            envelope(row(balance="10.50"), schema=False),
            envelope(row(exact={"scale": 4, "value": unscaled(1234567)})),
            envelope(months, fields=OTHER_MODES),
            envelope(beyond, fields=OTHER_MODES),
            envelope(row(wait=1.5), schema=False),
        ],
    )
    assert parsed[0][REASONS] == [
        "value does not match the declared schema: after.balance (decimal(12,2); is "
        "silver.debezium.decimal_handling_mode the connector's decimal.handling.mode?)"
    ]
    assert parsed[1][REASONS] == [
        "value does not match the declared schema: payload.after.exact (decimal(10,3); is "
        "silver.debezium.decimal_handling_mode the connector's decimal.handling.mode?)"
    ]
    assert parsed[2][REASONS] == [
        "value does not match the declared schema: payload.after.wait (bigint; "
        "interval.handling.mode=string sent months or years, which have no fixed length in "
        "microseconds: declare the column STRING for the ISO 8601 text)"
    ]
    assert parsed[2]["span"] == "P1Y2M3DT4H5M6.78S"  # as sent
    assert [p[REASONS] for p in parsed[3:]] == [
        ["value does not match the declared schema: payload.after.wait (bigint)"],
        ["value does not match the declared schema: after.wait (bigint)"],
    ]


def test_interval_and_hstore_in_their_other_modes_decode_with_and_without_the_schema(
    spark: SparkSession,
) -> None:
    """``interval.handling.mode=string`` (ISO 8601, converted to microseconds exactly: where the
    numeric mode's double arithmetic gives 2.01 s as 2,009,999 µs, this gives 2,010,000) and
    ``hstore.handling.mode=map`` (a JSON object: as text, the JSON the ``json`` mode sends), by
    the record's schema and bare: no setting tells them apart, their values do."""
    other = row(wait=THREE_DAYS_ISO, span=THREE_DAYS_ISO, attrs={"tier": "gold", "note": None},
                extras={"tier": "gold", "note": None})  # fmt: skip
    signed = {"id": 2, "wait": "P0Y0M-1DT2H0M0S", "span": "P0Y0M0DT-4H-5M-6.78S"}
    parsed = parse(
        spark,
        [
            envelope(other, fields=OTHER_MODES),
            envelope(other, schema=False),
            envelope(row(**signed), fields=OTHER_MODES),
            envelope(row(id=3, wait="P0Y0M0DT0H0M3600S"), schema=False),  # from a number
            envelope(row(id=4, wait="P0Y0M0DT0H0M2.01S"), fields=OTHER_MODES),
        ],
    )
    assert [p[REASONS] for p in parsed] == [[]] * 5
    assert values_of(parsed[0]) == values_of(parsed[1]) == {**EXPECTED, "span": THREE_DAYS_ISO}
    assert (parsed[2]["wait"], parsed[2]["span"]) == (-79_200_000_000, "P0Y0M0DT-4H-5M-6.78S")
    assert [p["wait"] for p in parsed[3:]] == [3_600_000_000, 2_010_000]


def test_a_toast_placeholder_is_never_parsed_as_a_value(spark: SparkSession) -> None:
    """The placeholder, in each of its forms (text, base64 bytes, a one-element array), is null
    and named in ``_unavailable``; the stage carries the key's stored value into it
    (``pipelines/silver/changes.py``, ``test_debezium_changes.py``)."""
    unsent = base64.b64encode(UNAVAILABLE.encode()).decode()
    parsed = parse(spark, [envelope(row(profile=UNAVAILABLE, tags=[UNAVAILABLE], avatar=unsent))])
    assert parsed[0][REASONS] == []
    assert (parsed[0]["profile"], parsed[0]["tags"], parsed[0]["avatar"]) == (None, None, None)
    assert parsed[0][UNAVAILABLE_COLUMNS] == ["avatar", "profile", "tags"]


def test_twos_complement_bytes_of_any_length(spark: SparkSession) -> None:
    values = [0, 1, -1, 127, 128, -128, -129, 2**31, -(2**40) + 3, 10**17, -(10**17) + 3]
    parsed = parse(spark, [envelope(row(id=i, balance=unscaled(v))) for i, v in enumerate(values)])
    for value, got in zip(values, parsed, strict=True):
        expected = Decimal(value).scaleb(-2)
        if abs(expected) >= 10**10:  # beyond DECIMAL(12,2): not decoded, named
            assert got[REASONS] and got["balance"] is None, (value, got)
        else:
            assert got["balance"] == expected, (value, got[REASONS])


def test_a_change_keeps_its_position_and_op_and_a_delete_reads_its_before_image(
    spark: SparkSession,
) -> None:
    deleted = json.loads(envelope(row(), op="d", lsn=200))
    deleted["payload"]["before"], deleted["payload"]["after"] = deleted["payload"]["after"], None
    parsed = parse(spark, [envelope(row(), op="c"), json.dumps(deleted).encode()])
    assert [(p["_op"], p["_source_lsn"], p[REASONS]) for p in parsed] == [
        ("c", 100, []),
        ("d", 200, []),
    ]
    assert values_of(parsed[1]) == EXPECTED

"""What :mod:`pipelines.silver.debezium` reads as text, and the ISO 8601 durations it accepts,
checked without a JVM. The Spark decoding itself: tests/integration/test_debezium_values.py."""

from __future__ import annotations

import re

import pytest
from pyspark.sql.types import IntegerType, LongType, StringType

from pipelines.silver.debezium import _ISO_DURATION, wire_type

#: What Debezium 3.6.1 (``io.debezium.time.Interval.toIsoString`` on the PostgreSQL driver's
#: ``PGInterval``, run from the connector's jars) writes with ``interval.handling.mode=string``
#: for the PostgreSQL intervals beside them; the last is its conversion of a bare microsecond
#: count.
DEBEZIUM_WRITES = {
    "1 year 2 mons 3 days 04:05:06.78": "P1Y2M3DT4H5M6.78S",
    "-1 days +02:00:00": "P0Y0M-1DT2H0M0S",
    "-04:05:06.78": "P0Y0M0DT-4H-5M-6.78S",
    "100:00:00": "P0Y0M0DT100H0M0S",
    "00:00:00.000001": "P0Y0M0DT0H0M0.000001S",
    "-1 years -2 mons": "P-1Y-2M0DT0H0M0S",
    "3600000000 µs": "P0Y0M0DT0H0M3600S",
}


def test_bigint_is_read_as_text_for_the_iso_durations_an_interval_may_arrive_as() -> None:
    assert wire_type(LongType()) == StringType()
    assert wire_type(IntegerType()) == IntegerType()  # an interval is never an int32


@pytest.mark.parametrize("written", DEBEZIUM_WRITES.values())
def test_every_duration_debezium_writes_is_read(written: str) -> None:
    assert re.match(_ISO_DURATION, written)


@pytest.mark.parametrize("other", ["1.5", "P1.5D", "PT1,5S", "-P1D", "P1W", "1 day"])
def test_what_debezium_does_not_write_is_not_read_as_a_duration(other: str) -> None:
    assert not re.match(_ISO_DURATION, other)

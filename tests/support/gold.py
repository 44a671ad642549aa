"""An independent reference for gold tables: windowed aggregates in plain Python, and gold rows read
back with delta-rs, in one comparable shape; late tables of the layout before late rows kept their
silver row."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.location import Location
from tests.support.delta_read import TableRef, read_rows

#: (window start, group key) -> {aggregate name: value, "_rows": n}
GoldRows = dict[tuple[datetime, tuple[Any, ...]], dict[str, float]]


def windows_of(event_time: datetime, duration: timedelta, slide: timedelta) -> list[datetime]:
    """Starts of the windows holding ``event_time``: multiples of ``slide`` since the epoch."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    offset = (event_time - epoch) % slide
    last = event_time - offset
    starts, start = [], last
    while start + duration > event_time:
        starts.append(start)
        start -= slide
    return sorted(starts)


def expected_gold(
    events: Iterable[dict[str, Any]],
    duration: timedelta,
    slide: timedelta | None = None,
    group_by: Sequence[str] = (),
    value: str = "amount",
) -> GoldRows:
    """sum, count and max of ``value`` per window and group, and ``_rows``."""
    rows: dict[tuple[datetime, tuple[Any, ...]], list[float]] = defaultdict(list)
    for event in events:
        for start in windows_of(event["ts"], duration, slide or duration):
            rows[(start, tuple(event[g] for g in group_by))].append(float(event[value]))
    return {
        key: {"revenue": round(sum(v), 6), "orders": len(v), "biggest": max(v), "_rows": len(v)}
        for key, v in rows.items()
    }


def read_gold(path: TableRef, group_by: Sequence[str] = (), where: str = "") -> GoldRows:
    """The gold table's rows in the shape of :func:`expected_gold` (its aggregates as stored)."""
    result: GoldRows = {}
    for row in read_rows(path, where=where):
        start = row["window_start"]
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start
        key = (start, tuple(row[g] for g in group_by))
        assert key not in result, f"two gold rows for {key}"
        result[key] = {
            k: round(float(v), 6) if isinstance(v, float) else v
            for k, v in row.items()
            if k not in ("window_start", "window_end", "_event_date", "_updated_at", *group_by)
        }
    return result


def project(rows: GoldRows, names: Sequence[str]) -> GoldRows:
    """Only the aggregates ``names`` of each row."""
    return {key: {n: values[n] for n in names} for key, values in rows.items()}


#: A joined row, comparable: (order id, left amount, payment id or None, paid or None).
JoinedRow = tuple[Any, ...]


def expected_join(
    left: Iterable[dict[str, Any]],
    right: Iterable[dict[str, Any]],
    after: timedelta,
    before: timedelta = timedelta(0),
    outer: bool = False,
) -> list[JoinedRow]:
    """Orders joined with payments on ``order_id`` with ``ts - before <= paid_at <= ts + after``
    (nested loops: no shared code with the engine); with ``outer``, unmatched orders too."""
    rows: list[JoinedRow] = []
    right = list(right)
    for order in left:
        matches = [
            (p["payment_id"], p["paid"])
            for p in right
            if p["order_id"] == order["order_id"]
            and order["ts"] - before <= p["paid_at"] <= order["ts"] + after
        ]
        if not matches and outer:
            matches = [(None, None)]
        rows += [(order["order_id"], order["amount"], *m) for m in matches]
    return sorted(rows, key=repr)


def read_join(path: TableRef, where: str = "") -> list[JoinedRow]:
    """The joined table's rows in the shape of :func:`expected_join`."""
    rows = read_rows(path, ["order_id", "amount", "payment_id", "paid"], where)
    return sorted(
        ((r["order_id"], r["amount"], r["payment_id"], r["paid"]) for r in rows), key=repr
    )


def utc_values(row: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The values ``names`` of a row read back, timestamps as aware UTC datetimes."""

    def utc(value: Any) -> Any:
        if isinstance(value, datetime) and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    return {name: utc(row[name]) for name in names}


def in_older_layout(
    spark: SparkSession,
    table: Location,
    drop: Sequence[str] = (),
    keep: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Rewrite the late table ``table`` in the layout before late rows kept their silver row:
    without the columns ``drop``, and its structs ``keep`` (name -> fields) with only those
    fields (a join's columns); its table properties (the flow's identity) and partitioning stay."""
    path = str(table)
    frame = spark.read.format("delta").load(path).drop(*drop)
    for name, fields in (keep or {}).items():
        narrow = F.struct(*(F.col(f"{name}.{field}").alias(field) for field in fields))
        frame = frame.withColumn(name, F.when(F.col(name).isNotNull(), narrow))
    (
        frame.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy("_event_date")
        .save(path)
    )

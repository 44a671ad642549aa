"""An independent reference for gold tables: windowed aggregates in plain Python, and gold rows read
back with delta-rs, in one comparable shape."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

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

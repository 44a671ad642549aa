"""Reading bronze tables independently of Spark: delta-rs (the ``deltalake`` package) opens the
Delta log and the Parquet files itself, so a check never trusts the engine that wrote them."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
from deltalake.exceptions import TableNotFoundError

from tests.support.delta_read import TableRef, delta_table


def read_bronze(
    table: TableRef, columns: tuple[str, ...] = ("partition", "offset", "value")
) -> pa.Table:
    return delta_table(table).to_pyarrow_table(columns=list(columns))


def bronze_version(table: TableRef) -> int:
    return int(delta_table(table).version())


def bronze_rows(table: TableRef) -> int:
    """Rows in the table now (0 before its first commit)."""
    try:
        return read_bronze(table, ("offset",)).num_rows
    except TableNotFoundError:  # not created yet, or its first commit not written yet
        return 0


def assert_exactly_once(table: TableRef, produced: list[tuple[bytes, bytes]]) -> None:
    """Every produced record is in the table once: no loss, no duplicate, values unchanged."""
    rows = read_bronze(table)
    coordinates = Counter(
        zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)
    )
    duplicated = {c: n for c, n in coordinates.items() if n > 1}
    assert not duplicated, (
        f"{len(duplicated)} (partition, offset) written twice: {list(duplicated)[:5]}"
    )
    assert rows.num_rows == len(produced), (
        f"table holds {rows.num_rows} rows, {len(produced)} produced"
    )
    assert Counter(rows["value"].to_pylist()) == Counter(value for _key, value in produced)

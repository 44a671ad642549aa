"""Reading Delta tables independently of Spark, with delta-rs (the ``deltalake`` package).

Current-state and history tables use deletion vectors (and may use column mapping), which
delta-rs's plain ``DeltaTable.to_pyarrow_table`` refuses; its ``QueryBuilder`` (DataFusion) reads
them. Every test reads silver tables through :func:`read_rows`, so each feature a spec can enable
is read back this way.

A table is given as a :class:`~pipelines.location.Location` (what the catalog hands out: on the
local disk or on an S3 store, whose connection delta-rs is given) or as a plain path / URI string.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from pipelines.location import Location

#: A table as the tests name it: a catalog location, or a local path.
TableRef = Location | Path | str


def delta_table(table: TableRef, version: int | None = None) -> DeltaTable:
    """The table opened with delta-rs (at ``version``, default the latest), reaching an S3 store
    with the location's connection."""
    if isinstance(table, Location):
        return DeltaTable(table.uri, version=version, storage_options=table.delta_rs_options())
    return DeltaTable(str(table), version=version)


def read_arrow(table: TableRef, columns: list[str] | None = None, where: str = "") -> pa.Table:
    """The table's rows (``columns``, default all; an optional SQL ``where``) as Arrow."""
    selected = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    query = f"SELECT {selected} FROM t" + (f" WHERE {where}" if where else "")
    builder = QueryBuilder().register("t", delta_table(table))
    return pa.table(builder.execute(query).read_all())


def read_rows(
    table: TableRef, columns: list[str] | None = None, where: str = ""
) -> list[dict[str, Any]]:
    """The table's rows as dicts (see :func:`read_arrow`)."""
    return read_arrow(table, columns, where).to_pylist()

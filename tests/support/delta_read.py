"""Reading Delta tables independently of Spark, with delta-rs (the ``deltalake`` package).

Current-state and history tables use deletion vectors (and may use column mapping), which
delta-rs's plain ``DeltaTable.to_pyarrow_table`` refuses; its ``QueryBuilder`` (DataFusion) reads
them. Every test reads silver tables through :func:`read_rows`, so each feature a spec can enable
is read back this way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder


def read_arrow(path: Path | str, columns: list[str] | None = None, where: str = "") -> pa.Table:
    """The table's rows (``columns``, default all; an optional SQL ``where``) as Arrow."""
    selected = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    query = f"SELECT {selected} FROM t" + (f" WHERE {where}" if where else "")
    builder = QueryBuilder().register("t", DeltaTable(str(path)))
    return pa.table(builder.execute(query).read_all())


def read_rows(
    path: Path | str, columns: list[str] | None = None, where: str = ""
) -> list[dict[str, Any]]:
    """The table's rows as dicts (see :func:`read_arrow`)."""
    return read_arrow(path, columns, where).to_pylist()

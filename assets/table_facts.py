"""What a Delta table holds now, as Dagster metadata: schema, row count, version and history.

Read from the table's Delta log with delta-rs (the ``deltalake`` package), in the Dagster process
and without a JVM: a few milliseconds per table, so the launcher can attach it to every
materialization it reports and the UI shows the table as it is after the write. The row count
comes from the log's per-file statistics (minus rows a deletion vector removed), never from a
scan. A table that does not exist yet (a stream stopped before its first write) has no facts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from dagster import (
    MetadataValue,
    TableColumn,
    TableColumnConstraints,
    TableColumnLineage,
    TableRecord,
    TableSchema,
)
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

#: How many of the table's latest commits the ``history`` metadata shows.
HISTORY_COMMITS = 5
HISTORY_SCHEMA = TableSchema(
    columns=[
        TableColumn("version", "int"),
        TableColumn("timestamp", "string"),
        TableColumn("operation", "string"),
        TableColumn("rows_written", "int"),
        TableColumn("detail", "string"),
    ]
)


def _type_name(data_type: Any) -> str:
    """Spark-style type names (``long``, ``struct<...>``) from a delta-rs schema type."""
    kind = getattr(data_type, "type", None)
    if isinstance(kind, str):  # a primitive type
        return kind
    as_json = json.loads(data_type.to_json()) if hasattr(data_type, "to_json") else None
    if isinstance(as_json, dict):
        return str(as_json.get("type", "?"))
    return str(as_json or data_type)


def column_schema(table: DeltaTable) -> TableSchema:
    return TableSchema(
        columns=[
            TableColumn(
                name=field.name,
                type=_type_name(field.type),
                constraints=TableColumnConstraints(nullable=field.nullable),
            )
            for field in table.schema().fields
        ]
    )


def row_count(table: DeltaTable) -> int:
    """Rows in the current version, from the log's statistics (deletion vectors subtracted)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    rows = sum(n or 0 for n in actions.column("num_records").to_pylist())
    if "deletionVector.cardinality" in actions.column_names:
        rows -= sum(n or 0 for n in actions.column("deletionVector.cardinality").to_pylist())
    return rows


def _rows_written(metrics: Mapping[str, Any]) -> int:
    for name in ("numOutputRows", "numTargetRowsInserted", "num_added_rows"):
        if name in metrics:
            return int(metrics[name])
    return 0


def history(table: DeltaTable, commits: int = HISTORY_COMMITS) -> MetadataValue:
    """The latest ``commits`` commits, newest first, as a table the UI renders."""
    records = []
    for commit in table.history(commits):
        millis = commit.get("timestamp")
        when = datetime.fromtimestamp(millis / 1000, UTC).isoformat() if millis else ""
        parameters = commit.get("operationParameters") or {}
        detail = ", ".join(
            f"{k}={v}" for k, v in parameters.items() if k in ("mode", "predicate", "txnAppId")
        )
        txn = commit.get("txn") or {}
        if not detail and txn:
            detail = f"txn {txn.get('appId')} v{txn.get('version')}"
        records.append(
            TableRecord(
                {
                    "version": int(commit.get("version", -1)),
                    "timestamp": when,
                    "operation": str(commit.get("operation", "")),
                    "rows_written": _rows_written(commit.get("operationMetrics") or {}),
                    "detail": detail[:200],
                }
            )
        )
    return MetadataValue.table(records, schema=HISTORY_SCHEMA)


def table_metadata(path: str | Path, lineage: TableColumnLineage | None = None) -> dict[str, Any]:
    """Schema, row count, Delta version and latest commits of the table at ``path`` (a path or
    URI delta-rs reads), plus its column lineage when given; empty when no table is there."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return {}
    metadata: dict[str, Any] = {
        "dagster/column_schema": column_schema(table),
        "dagster/row_count": MetadataValue.int(row_count(table)),
        "delta_version": MetadataValue.int(table.version()),
        "table_uri": MetadataValue.path(str(path)),
        "history": history(table),
    }
    if lineage is not None:
        metadata["dagster/column_lineage"] = lineage
    return metadata

"""Silver over plain keyed JSON streams: compacted-topic semantics, partial updates, bad input, and
spec changes refused against existing tables (real Kafka, Spark and Delta; delta-rs reads back).

Two flows run side by side in one application:

* ``keyed``: the default sequence (the record's offset: a key stays in one partition, so its
  offsets are its log order, as in a compacted topic), tombstones delete their key (the key
  read from the Kafka key), ``delete_when`` marks soft deletes, ``ignore_null_updates`` completes
  partial updates, ``except_columns`` drops a column from the current table;
* ``sequenced``: a composite key and a declared ``sequence_by`` column, records sent out of
  sequence order across several micro-batches (bounded by ``max_offsets_per_trigger`` for bronze
  and ``max_files_per_trigger`` for silver), so that an older version and a late update after a
  delete arrive after the newer state: neither may win.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.errors import ConfigError
from pipelines.locations import silver_table_path
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.silver.tables import reset_silver
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker

Record = tuple[bytes | None, bytes | None]


def record(key: Any, value: dict[str, Any] | None) -> Record:
    key_bytes = key if isinstance(key, bytes) else json.dumps(key).encode()
    return key_bytes, None if value is None else json.dumps(value).encode()


KEYED_RECORDS: list[Record] = [
    record({"id": 1}, {"id": 1, "name": "ann", "tier": "gold", "status": "active", "note": "x"}),
    record({"id": 2}, {"id": 2, "name": "bob", "tier": "silver", "status": "active"}),
    record({"id": 3}, {"id": 3, "name": "cy", "tier": "bronze", "status": "active"}),
    # a partial update: only the tier changes, the name must stay
    record({"id": 1}, {"id": 1, "name": None, "tier": "platinum", "status": "active"}),
    record({"id": 2}, None),  # a tombstone deletes id 2 (key as JSON)
    record(
        {"id": 3}, {"id": 3, "name": "cy", "tier": "bronze", "status": "deleted"}
    ),  # soft delete
    record(b"4", {"id": 4, "name": "dee", "tier": "gold", "status": "active"}),
    record(b"4", None),  # a tombstone whose key is the bare id
    record(b"4", {"id": 4, "name": "dee again", "tier": "gold", "status": "active"}),  # re-create
    # bad input: each lands in quarantine with its reason, the stream goes on
    (b"5", b"\xff\xfe not utf-8"),
    (b"6", b'{"id": 6, "name": "trunc'),
    (b"7", b'{"id": "seven", "name": "x"}'),
    (b"8", b'{"name": "no id"}'),
    (b"not-a-number", None),  # a tombstone whose key names no id
]
KEYED_EXPECTED = {
    1: {"name": "ann", "tier": "platinum", "status": "active"},
    4: {"name": "dee again", "tier": "gold", "status": "active"},
}
KEYED_REASONS = {
    b"5": "not valid UTF-8",
    b"6": "not valid JSON",
    b"7": "does not match the declared schema: id (bigint)",
    b"8": "missing key column id",
    b"not-a-number": "missing key column id",
}

# (region, id, seq, name, deleted) in the order sent: versions arrive out of sequence order
SEQUENCED_ROWS = [
    ("eu", 1, 5, "v5", False),
    ("eu", 1, 3, "v3", False),  # older than what is stored: ignored
    ("us", 1, 2, "v2", False),
    ("us", 1, 9, "gone", True),  # deleted at 9
    ("us", 1, 7, "v7", False),  # late update older than the delete: must not resurrect
    ("eu", 2, 1, "v1", False),
    ("eu", 2, 1, "v1", False),  # a duplicate
    ("eu", 2, 4, "v4", False),
    ("us", 2, 3, "v3", False),
    ("us", 2, 6, "gone", True),
    ("us", 2, 8, "back", False),  # a re-create newer than the delete
    ("eu", 3, None, "no seq", False),  # null sequence: quarantined
]
SEQUENCED_EXPECTED = {("eu", 1): "v5", ("eu", 2): "v4", ("us", 2): "back"}


def keyed_flow(topic: str) -> dict[str, Any]:
    return {
        "name": "keyed",
        "source": {"kind": "kafka", "topics": [topic]},
        "target": {"table": "bronze_keyed"},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, name STRING, tier STRING, status STRING, note STRING",
            "current": {
                "table": "keyed_current",
                "keys": ["id"],
                "delete_when": "status = 'deleted'",
                "ignore_null_updates": True,
                "except_columns": ["note"],
            },
        },
    }


def sequenced_flow(topic: str, keys: list[str]) -> dict[str, Any]:
    return {
        "name": "sequenced",
        "source": {"kind": "kafka", "topics": [topic], "max_offsets_per_trigger": 3},
        "target": {"table": "bronze_sequenced"},
        "silver": {
            "format": "json",
            "schema": {
                "region": "string",
                "id": "bigint",
                "seq": "bigint",
                "name": "string",
                "deleted": "boolean",
            },
            "max_files_per_trigger": 1,
            "current": {
                "table": "sequenced_current",
                "keys": keys,
                "sequence_by": "seq",
                "delete_when": "deleted",
            },
        },
    }


def current_rows(spec: FlowSpec, settings: Settings) -> list[dict[str, Any]]:
    assert spec.silver is not None and spec.silver.current is not None
    path = silver_table_path(settings, spec.silver.current.table)
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def quarantine_rows(spec: FlowSpec, settings: Settings) -> list[dict[str, Any]]:
    assert spec.silver is not None
    path = silver_table_path(settings, spec.silver.quarantine.table)
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


@pytest.fixture(scope="module")
def flows(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path_factory: Any
) -> tuple[FlowSpec, FlowSpec, Path]:
    """Both flows, run to the end of their topics in one application."""
    bootstrap = kafka_broker.bootstrap_servers
    folder = tmp_path_factory.mktemp("flows")
    create_topic(bootstrap, "silver_keyed", partitions=2)
    produce(bootstrap, "silver_keyed", KEYED_RECORDS)
    create_topic(bootstrap, "silver_sequenced", partitions=1)
    produce(
        bootstrap,
        "silver_sequenced",
        [
            record(
                {"region": r, "id": i},
                {"region": r, "id": i, "seq": s, "name": n, "deleted": d},
            )
            for r, i, s, n, d in SEQUENCED_ROWS
        ],
    )
    keyed = load_spec(write_spec(folder, keyed_flow("silver_keyed")))
    sequenced = load_spec(write_spec(folder, sequenced_flow("silver_sequenced", ["region", "id"])))
    code = run_flows([keyed, sequenced], spark_settings, Reporter(), StopRequest(None), spark=spark)
    assert code == EXIT_OK
    return keyed, sequenced, folder


def test_keyed_stream_compacts_like_a_compacted_topic(
    flows: tuple[FlowSpec, FlowSpec, Path], spark_settings: Settings
) -> None:
    keyed, _, _ = flows
    rows = current_rows(keyed, spark_settings)
    assert {r["id"]: {k: r[k] for k in ("name", "tier", "status")} for r in rows} == KEYED_EXPECTED
    assert all("note" not in r for r in rows)  # except_columns
    assert {r["_op"] for r in rows} == {"u"}


def test_bad_keyed_records_are_quarantined_with_their_reason(
    flows: tuple[FlowSpec, FlowSpec, Path], spark_settings: Settings
) -> None:
    keyed, _, _ = flows
    quarantined = {r["raw_key"]: r for r in quarantine_rows(keyed, spark_settings)}
    assert set(quarantined) == set(KEYED_REASONS)
    for key, reason in KEYED_REASONS.items():
        row = quarantined[key]
        assert any(reason in r for r in row["reasons"]), row
        assert row["flow"] == "keyed" and row["topic"] == "silver_keyed"
        assert row["offset"] is not None and row["batch_id"] is not None
    assert quarantined[b"5"]["raw_value"] == b"\xff\xfe not utf-8"  # the bytes, untouched


def test_out_of_sequence_versions_never_win(
    flows: tuple[FlowSpec, FlowSpec, Path], spark_settings: Settings
) -> None:
    _, sequenced, _ = flows
    rows = current_rows(sequenced, spark_settings)
    assert {(r["region"], r["id"]): r["name"] for r in rows} == SEQUENCED_EXPECTED
    assert {(r["region"], r["id"]): r["_sequence"] for r in rows} == {
        ("eu", 1): 5,
        ("eu", 2): 4,
        ("us", 2): 8,
    }
    reasons = [r["reasons"] for r in quarantine_rows(sequenced, spark_settings)]
    assert reasons == [["sequence value is null (sequence_by: seq)"]]
    events = DeltaTable(str(silver_table_path(spark_settings, "silver_sequenced_events")))
    assert events.to_pyarrow_table(columns=["id"]).num_rows == len(SEQUENCED_ROWS) - 1
    assert events.metadata().partition_columns == ["_event_date"]
    # several silver batches, so versions met across batches, not only inside one
    history = DeltaTable(str(silver_table_path(spark_settings, "sequenced_current"))).history()
    assert sum(1 for h in history if h.get("operation") == "MERGE") >= 3


def test_current_tables_feed_changes_downstream(
    flows: tuple[FlowSpec, FlowSpec, Path], spark: SparkSession, spark_settings: Settings
) -> None:
    del flows  # the module fixture ran both flows
    path = str(silver_table_path(spark_settings, "sequenced_current"))
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    ).load(path)
    kinds = {row["_change_type"] for row in changes.select("_change_type").collect()}
    assert {"insert", "delete"} <= kinds


def test_changed_keys_are_refused_then_rebuilt_from_bronze(
    flows: tuple[FlowSpec, FlowSpec, Path], spark: SparkSession, spark_settings: Settings
) -> None:
    _, _, folder = flows
    changed = load_spec(write_spec(folder, sequenced_flow("silver_sequenced", ["id"])))
    with pytest.raises(ConfigError) as refused:
        run_flows([changed], spark_settings, Reporter(), StopRequest(None), spark=spark)
    message = str(refused.value)
    assert "silver.current" in message and "keys changed from 'region,id' to 'id'" in message
    assert "conflux reset sequenced --stage silver" in message

    moved = reset_silver(changed, spark_settings)
    assert any("sequenced_current" in what for what, _ in moved)
    code = run_flows([changed], spark_settings, Reporter(), StopRequest(None), spark=spark)
    assert code == EXIT_OK
    rows = current_rows(changed, spark_settings)
    # keyed by id alone, rebuilt from every bronze record: id 1's newest is the delete at 9,
    # id 2's the re-create at 8
    assert {r["id"]: r["name"] for r in rows} == {2: "back"}

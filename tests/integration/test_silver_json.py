"""Silver over plain keyed JSON streams: compacted-topic semantics, partial updates, bad input, and
spec changes refused against existing tables (real Kafka, Spark and Delta; delta-rs reads back).

Three flows run side by side in one application (the module fixture, one ``run_flows``):

* ``keyed``: the default sequence (the record's offset: a key stays in one partition, so its
  offsets are its log order, as in a compacted topic), tombstones delete their key (the key
  read from the Kafka key), ``delete_when`` marks soft deletes, ``ignore_null_updates`` completes
  partial updates, ``except_columns`` drops a column from the current table;
* ``sequenced``: a composite key and a declared ``sequence_by`` column, records sent out of
  sequence order across three micro-batches (bounded by ``max_offsets_per_trigger`` for bronze
  and ``max_files_per_trigger`` for silver), so that a late update after a stored delete, a
  duplicate and a version older than a stored one arrive a batch after the state they lose to:
  none may win;
* ``refreshed``: the first run of the full-refresh test (its history tracking ``tier``), whose
  test then changes the spec, refreshes while bronze ingests, and runs on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pyspark.sql import SparkSession

from pipelines.catalog.lifecycle import reset_stage
from pipelines.catalog.state import FlowState
from pipelines.delta_writes import BACKGROUND_CHECKPOINT_PROPERTIES as BACKGROUND_CHECKPOINTS
from pipelines.errors import ConfigError
from pipelines.identity import read_identity
from pipelines.lease import FlowLease, LeaseHeldError
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_FAILED, EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.delta_read import delta_table, read_rows
from tests.support.kafka import create_topic, produce
from tests.support.runtime import KafkaBroker
from tests.support.tables import silver_path

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

#: Records per bronze batch (and so per silver batch: one bronze file each) of the sequenced flow.
SEQUENCED_BATCH = 5
# (region, id, seq, name, deleted) in the order sent, SEQUENCED_BATCH records a batch: versions
# arrive out of sequence order, each late one a batch after the stored state it is older than
SEQUENCED_ROWS = [
    # batch 0
    ("eu", 1, 5, "v5", False),
    ("eu", 1, 3, "v3", False),  # older than the version sent before it: never current
    ("us", 1, 2, "v2", False),
    ("eu", 2, 1, "v1", False),
    ("us", 2, 3, "v3", False),
    # batch 1
    ("us", 1, 9, "gone", True),  # deletes the stored v2 at 9
    ("eu", 2, 1, "v1", False),  # a duplicate of a stored version
    ("eu", 2, 4, "v4", False),
    ("us", 2, 6, "gone", True),
    ("eu", 3, None, "no seq", False),  # null sequence: quarantined
    # batch 2
    ("us", 1, 7, "v7", False),  # late update older than the stored delete: must not resurrect
    ("us", 2, 8, "back", False),  # a re-create newer than the stored delete
    ("eu", 2, 2, "v2 late", False),  # splits the stored version [1, 4)
]
#: The history table (tracking ``name``): (name, valid_from, valid_to) per key, in order.
SEQUENCED_HISTORY = {
    ("eu", 1): [("v3", 3, 5), ("v5", 5, None)],  # the older version, arriving second, in place
    ("us", 1): [("v2", 2, 7), ("v7", 7, 9)],  # the late v7 between v2 and the delete at 9
    ("eu", 2): [("v1", 1, 2), ("v2 late", 2, 4), ("v4", 4, None)],  # the duplicate: no version
    ("us", 2): [("v3", 3, 6), ("back", 8, None)],  # a delete closes, a re-create opens
}
TRANSFORMS = """
from pyspark.sql import DataFrame, functions as F


def shout(events: DataFrame) -> DataFrame:
    return events.withColumn("name_upper", F.upper("name"))


def lose_sequence(events: DataFrame) -> DataFrame:
    return events.drop("_sequence")


def boom(events: DataFrame) -> DataFrame:
    fail = F.udf(lambda name: 1 // 0 if name == "ann" else name, "string")
    return events.withColumn("name", fail("name"))
"""
SEQUENCED_EXPECTED = {("eu", 1): "v5", ("eu", 2): "v4", ("us", 2): "back"}


def keyed_flow(topic: str) -> dict[str, Any]:
    return {
        "name": "keyed",
        "source": {"kind": "kafka", "topics": [topic]},
        "target": {"table": "bronze_keyed"},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, name STRING, tier STRING, status STRING, note STRING",
            "transform": "keyed_transforms:shout",
            "events": {"table": "silver_keyed_events", "deletion_vectors": True},
            "current": {
                "table": "keyed_current",
                "keys": ["id"],
                "delete_when": "status = 'deleted'",
                "ignore_null_updates": True,
                "except_columns": ["note"],
                "column_mapping": "name",
                "properties": {"delta.checkpointInterval": 5},
            },
        },
    }


def sequenced_flow(
    topic: str, keys: list[str], max_files_per_trigger: int | None = 1
) -> dict[str, Any]:
    """The sequenced flow; ``max_files_per_trigger`` 1: one silver batch per bronze batch (a
    bronze batch of one partition writes one file), None: silver takes all bronze has."""
    return {
        "name": "sequenced",
        "source": {
            "kind": "kafka",
            "topics": [topic],
            "max_offsets_per_trigger": SEQUENCED_BATCH,
        },
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
            "max_files_per_trigger": max_files_per_trigger,
            "current": {
                "table": "sequenced_current",
                "keys": keys,
                "sequence_by": "seq",
                "delete_when": "deleted",
            },
            "history": {"table": "sequenced_history", "track_history": ["name"]},
        },
    }


def current_rows(spec: FlowSpec, settings: Settings) -> list[dict[str, Any]]:
    assert spec.silver is not None and spec.silver.current is not None
    path = silver_path(settings, spec.silver.current.table)
    return read_rows(path)


def quarantine_rows(spec: FlowSpec, settings: Settings) -> list[dict[str, Any]]:
    assert spec.silver is not None
    path = silver_path(settings, spec.silver.quarantine.table)
    return read_rows(path)


class Flows(NamedTuple):
    """The module's flows as the fixture ran them, and the folder of their specs."""

    keyed: FlowSpec
    sequenced: FlowSpec
    refreshed: FlowSpec  # tracking tier: the full-refresh test's spec before it changes
    folder: Path


@pytest.fixture(scope="module")
def flows(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path_factory: Any
) -> Flows:
    """The three flows, run to the end of their topics in one application: each test asserts
    its own flow's outcome, so one run serves them all (one start and stop of the queries)."""
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
    create_topic(bootstrap, REFRESH_TOPIC, partitions=1)
    produce(bootstrap, REFRESH_TOPIC, refresh_records(REFRESH_PART_1))
    (folder / "keyed_transforms.py").write_text(TRANSFORMS)
    keyed = load_spec(write_spec(folder, keyed_flow("silver_keyed")))
    sequenced = load_spec(write_spec(folder, sequenced_flow("silver_sequenced", ["region", "id"])))
    by_tier = load_spec(write_spec(folder, refreshed_flow(REFRESH_TOPIC, ["tier"])))
    code = run_flows(
        [keyed, sequenced, by_tier], spark_settings, Reporter(), StopRequest(None), spark=spark
    )
    assert code == EXIT_OK
    return Flows(keyed, sequenced, by_tier, folder)


def test_keyed_stream_compacts_like_a_compacted_topic(
    flows: Flows, spark_settings: Settings
) -> None:
    keyed = flows.keyed
    rows = current_rows(keyed, spark_settings)
    assert {r["id"]: {k: r[k] for k in ("name", "tier", "status")} for r in rows} == KEYED_EXPECTED
    assert all("note" not in r for r in rows)  # except_columns
    assert {r["_op"] for r in rows} == {"u"}
    # the transform's column, completed like the others on a partial update
    assert {r["id"]: r["name_upper"] for r in rows} == {1: "ANN", 4: "DEE AGAIN"}


def test_table_features_from_the_spec(
    flows: Flows, spark: SparkSession, spark_settings: Settings
) -> None:
    del flows  # the module fixture ran the flows
    features = {
        "keyed_current": {
            "delta.columnMapping.mode": "name",
            "delta.enableDeletionVectors": "true",
            "delta.enableChangeDataFeed": "true",
            "delta.checkpointInterval": "5",
        },
        # checkpointed in the background (a property the spec sets wins, as above)
        "silver_keyed_events": {"delta.enableDeletionVectors": "true", **BACKGROUND_CHECKPOINTS},
        "sequenced_history": {
            "delta.enableDeletionVectors": "true",
            "delta.enableChangeDataFeed": "true",
            **BACKGROUND_CHECKPOINTS,
        },
    }
    for table, expected in features.items():
        path = silver_path(spark_settings, table)
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
        assert detail is not None
        assert expected.items() <= dict(detail["properties"]).items(), (table, detail)
        assert read_rows(path), table  # delta-rs reads each of them (QueryBuilder)


def keyed_with_transform(folder: Path, name: str, transform: str) -> FlowSpec:
    """The keyed flow under another name and tables, with ``transform``."""
    spec = keyed_flow("silver_keyed") | {"name": f"keyed_{name}", "target": {"table": f"b_{name}"}}
    spec["silver"] = spec["silver"] | {
        "transform": transform,
        "events": {"table": f"{name}_events"},
        "quarantine": {"table": f"{name}_quarantine"},
        "current": spec["silver"]["current"] | {"table": f"{name}_current"},
    }
    return load_spec(write_spec(folder, spec))


def test_a_transform_that_drops_a_needed_column_is_refused_at_start(
    flows: Flows, spark: SparkSession, spark_settings: Settings
) -> None:
    folder = flows.folder
    lossy = keyed_with_transform(folder, "lossy", "keyed_transforms:lose_sequence")
    with pytest.raises(ConfigError) as refused:
        run_flows([lossy], spark_settings, Reporter(), StopRequest(None), spark=spark)
    message = str(refused.value)
    assert "silver.transform keyed_transforms:lose_sequence" in message
    assert "dropped metadata column _sequence" in message


class _Errors(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)
        super().error(message)


def test_a_failing_transform_fails_the_flow_naming_function_flow_and_batch(
    flows: Flows, spark: SparkSession, spark_settings: Settings
) -> None:
    folder = flows.folder
    broken = keyed_with_transform(folder, "boom", "keyed_transforms:boom")
    reporter = _Errors()
    code = run_flows([broken], spark_settings, reporter, StopRequest(None), spark=spark)
    assert code == EXIT_FAILED
    assert any(
        "silver.transform keyed_transforms:boom failed in flow keyed_boom, batch 0" in e
        and "ZeroDivisionError" in e
        for e in reporter.errors
    ), reporter.errors
    assert not read_rows(silver_path(spark_settings, "boom_events"))  # nothing written


def test_bad_keyed_records_are_quarantined_with_their_reason(
    flows: Flows, spark_settings: Settings
) -> None:
    keyed = flows.keyed
    quarantined = {r["raw_key"]: r for r in quarantine_rows(keyed, spark_settings)}
    assert set(quarantined) == set(KEYED_REASONS)
    for key, reason in KEYED_REASONS.items():
        row = quarantined[key]
        assert any(reason in r for r in row["reasons"]), row
        assert row["flow"] == "keyed" and row["topic"] == "silver_keyed"
        assert row["offset"] is not None and row["batch_id"] is not None
    assert quarantined[b"5"]["raw_value"] == b"\xff\xfe not utf-8"  # the bytes, untouched


def test_out_of_sequence_versions_never_win(flows: Flows, spark_settings: Settings) -> None:
    sequenced = flows.sequenced
    rows = current_rows(sequenced, spark_settings)
    assert {(r["region"], r["id"]): r["name"] for r in rows} == SEQUENCED_EXPECTED
    assert {(r["region"], r["id"]): r["_sequence"] for r in rows} == {
        ("eu", 1): 5,
        ("eu", 2): 4,
        ("us", 2): 8,
    }
    reasons = [r["reasons"] for r in quarantine_rows(sequenced, spark_settings)]
    assert reasons == [["sequence value is null (sequence_by: seq)"]]
    events = delta_table(silver_path(spark_settings, "silver_sequenced_events"))
    assert events.to_pyarrow_table(columns=["id"]).num_rows == len(SEQUENCED_ROWS) - 1
    assert events.metadata().partition_columns == ["_event_date"]
    # several silver batches, so versions met across batches, not only inside one
    history = delta_table(silver_path(spark_settings, "sequenced_current")).history()
    assert sum(1 for h in history if h.get("operation") == "MERGE") >= 3


def test_history_places_late_versions_and_fixes_their_neighbours(
    flows: Flows, spark_settings: Settings
) -> None:
    del flows
    rows = read_rows(silver_path(spark_settings, "sequenced_history"))
    got: dict[tuple[str, int], list[tuple[str, int, int | None]]] = {}
    for r in sorted(rows, key=lambda r: (r["region"], r["id"], r["_valid_from"])):
        got.setdefault((r["region"], r["id"]), []).append(
            (r["name"], r["_valid_from"], r["_valid_to"])
        )
        assert r["_is_current"] == (r["_valid_to"] is None), r
    assert got == SEQUENCED_HISTORY


def test_current_tables_feed_changes_downstream(
    flows: Flows, spark: SparkSession, spark_settings: Settings
) -> None:
    del flows  # the module fixture ran the flows
    path = str(silver_path(spark_settings, "sequenced_current"))
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    ).load(path)
    kinds = {row["_change_type"] for row in changes.select("_change_type").collect()}
    assert {"insert", "delete"} <= kinds


def test_changed_keys_are_refused_then_rebuilt_from_bronze(
    flows: Flows, spark: SparkSession, spark_settings: Settings
) -> None:
    folder = flows.folder
    # the rebuild needs no batch boundaries (the fixture's run met versions across batches): one
    # silver batch reads every bronze file; the batch limit is a read option, not a spec change
    # silver refuses
    changed = load_spec(write_spec(folder, sequenced_flow("silver_sequenced", ["id"], None)))
    with pytest.raises(ConfigError) as refused:
        run_flows([changed], spark_settings, Reporter(), StopRequest(None), spark=spark)
    message = str(refused.value)
    assert "silver.current" in message and "keys changed from 'region,id' to 'id'" in message
    assert "conflux reset sequenced --stage silver" in message

    moved = reset_stage(changed, spark_settings)
    assert any("sequenced_current" in what for what, _ in moved)
    code = run_flows([changed], spark_settings, Reporter(), StopRequest(None), spark=spark)
    assert code == EXIT_OK
    rows = current_rows(changed, spark_settings)
    # keyed by id alone, rebuilt from every bronze record: id 1's newest is the delete at 9,
    # id 2's the re-create at 8
    assert {r["id"]: r["name"] for r in rows} == {2: "back"}


# --- full refresh -------------------------------------------------------------------------------

#: (id, seq, name, tier): sent in two parts, the second while the refresh runs.
REFRESH_PART_1 = [(1, 1, "ann", "free"), (2, 2, "bob", "free"), (1, 3, "ann", "gold")]
REFRESH_PART_2 = [(1, 4, "anna", "gold"), (2, 5, "bob", "gold"), (3, 6, "cy", "free")]
REFRESH_TOPIC = "silver_refreshed"


def refresh_records(part: list[tuple[int, int, str, str]]) -> list[Record]:
    return [record({"id": i}, {"id": i, "seq": s, "name": n, "tier": t}) for i, s, n, t in part]


def refreshed_flow(topic: str, tracked: list[str]) -> dict[str, Any]:
    return {
        "name": "refreshed",
        "source": {"kind": "kafka", "topics": [topic]},
        "target": {"table": "bronze_refreshed"},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, seq BIGINT, name STRING, tier STRING",
            "current": {"table": "refreshed_current", "keys": ["id"], "sequence_by": "seq"},
            "history": {"table": "refreshed_history", "track_history": tracked},
        },
    }


def _history(settings: Settings) -> dict[int, list[tuple[str, str, int, int | None]]]:
    rows = read_rows(silver_path(settings, "refreshed_history"))
    got: dict[int, list[tuple[str, str, int, int | None]]] = {}
    for r in sorted(rows, key=lambda r: (r["id"], r["_valid_from"])):
        got.setdefault(r["id"], []).append((r["name"], r["tier"], r["_valid_from"], r["_valid_to"]))
    return got


def test_full_refresh_rebuilds_silver_under_a_changed_spec_while_bronze_ingests(
    flows: Flows, spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker
) -> None:
    bootstrap, topic, folder = kafka_broker.bootstrap_servers, REFRESH_TOPIC, flows.folder

    def send(part: list[tuple[int, int, str, str]]) -> None:
        produce(bootstrap, topic, refresh_records(part))

    # the first run (tracking tier, REFRESH_PART_1) was the module fixture's
    assert _history(spark_settings) == {  # a change of name alone updates in place
        1: [("ann", "free", 1, 3), ("ann", "gold", 3, None)],
        2: [("bob", "free", 2, None)],
    }

    send(REFRESH_PART_2)  # bronze ingests these during the refresh run
    by_name = load_spec(write_spec(folder, refreshed_flow(topic, ["name"])))
    with pytest.raises(ConfigError, match="trackHistory changed from 'tier' to 'name'"):
        run_flows([by_name], spark_settings, Reporter(), StopRequest(None), spark=spark)
    holder = FlowLease(
        "refreshed", FlowState.of(by_name, spark_settings).lease_store(), "someone-else", {}
    )
    holder.acquire()
    try:
        with pytest.raises(LeaseHeldError):
            run_flows(
                [by_name], spark_settings, Reporter(), StopRequest(None), spark=spark,
                full_refresh=True,
            )  # fmt: skip
    finally:
        holder.release()
    code = run_flows(
        [by_name], spark_settings, Reporter(), StopRequest(None), spark=spark, full_refresh=True
    )
    assert code == EXIT_OK
    assert _history(spark_settings) == {
        1: [("ann", "gold", 1, 4), ("anna", "gold", 4, None)],  # the tier change: in place
        2: [("bob", "gold", 2, None)],
        3: [("cy", "free", 6, None)],
    }
    current = {r["id"]: (r["name"], r["tier"]) for r in read_rows(
        silver_path(spark_settings, "refreshed_current"))}  # fmt: skip
    assert current == {1: ("anna", "gold"), 2: ("bob", "gold"), 3: ("cy", "free")}
    events = read_rows(silver_path(spark_settings, "silver_refreshed_events"), ["seq"])
    assert sorted(r["seq"] for r in events) == [1, 2, 3, 4, 5, 6]  # rebuilt, not appended twice
    locations = FlowState.of(by_name, spark_settings)
    identity = read_identity(locations)
    assert identity is not None and identity.silver_generation == 1
    assert not locations.refresh_marker.exists()
    # the replaced silver checkpoint, a folder (Location.names() lists files): on the local disk
    assert any(p.name.startswith("silver-") for p in Path(locations.archive_dir).iterdir())
    # the next plain run continues the rebuilt tables under the new app id
    send([(3, 7, "cyd", "free")])
    assert run_flows([by_name], spark_settings, Reporter(), StopRequest(None), spark=spark) == 0
    assert _history(spark_settings)[3] == [("cy", "free", 6, 7), ("cyd", "free", 7, None)]
    log = silver_path(spark_settings, "refreshed_history") / "_delta_log"
    txns = [
        json.loads(line)["txn"]
        for name in log.names()  # sorted
        if name.endswith(".json")
        for line in (log / name).read_text().splitlines()
        if '"txn"' in line
    ]
    assert txns[-1]["appId"].endswith("-s1-refreshed_history"), txns
    assert txns[-1]["version"] > txns[-2]["version"], txns


def test_versions_break_sequence_ties_and_restart_after_a_delete(spark: SparkSession) -> None:
    """Directly on ``versions_of``: one version per (key, sequence), a delete winning a tie; with
    ``ignore_null_updates`` a re-create's nulls are not filled from the deleted row's image."""
    from pipelines.silver.history import HistoryPlan, versions_of

    columns = "id BIGINT, name STRING, tier STRING, _sequence BIGINT, _op STRING, "
    columns += "_event_time TIMESTAMP, _source_partition INT, _source_offset BIGINT"
    rows = [
        (1, "a", "x", 1, "c", None, 0, 0),
        (1, "b", "x", 2, "u", None, 0, 1),
        (1, "c", "x", 2, "u", None, 1, 5),  # same sequence, a later record: it counts
        (2, "a", "x", 1, "c", None, 0, 2),
        (2, "a", "x", 3, "u", None, 0, 3),
        (2, "a", "x", 3, "d", None, 0, 4),  # a delete at the same sequence wins the tie
        (3, "a", "gold", 1, "c", None, 0, 6),
        (3, "a", "gold", 2, "d", None, 0, 7),  # the delete carries the before image
        (3, "b", None, 3, "c", None, 0, 8),  # re-created without a tier
    ]
    events = spark.createDataFrame(rows, columns)
    plan = HistoryPlan(("id",), ("name", "tier"), ("name", "tier"), ignore_null_updates=True)
    got = sorted(
        (r["id"], r["name"], r["tier"], r["_valid_from"], r["_valid_to"])
        for r in versions_of(events, plan).collect()
    )
    assert got == [
        (1, "a", "x", 1, 2),
        (1, "c", "x", 2, None),
        (2, "a", "x", 1, 3),
        (3, "a", "gold", 1, 2),
        (3, "b", None, 3, None),
    ]

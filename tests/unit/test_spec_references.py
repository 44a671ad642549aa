"""Every column a spec names is checked when it loads, in its SQL expressions too, and a spec with
several problems reports them all (``SpecError.problems``); without Spark.

The tokenizer's reading of Spark SQL (``pipelines/spec/references.py``) was compared once, by
hand, with Spark 4.1's analysis of some 80 expressions like these: it refused none that Spark
resolves (it misses bare keywords used as names, such as ``year``, and struct fields).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.spec import SpecError, check_specs, column_references, load_specs, parse_spec

SCHEMA = "id BIGINT, amount DOUBLE, status STRING, updated_at TIMESTAMP, addr STRUCT<city: STRING>"


def spec(silver: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "silver": {"format": "debezium", "schema": SCHEMA, **(silver or {})},
        **more,
    }
    return data


def current(**fields: Any) -> dict[str, Any]:
    return {"current": {"table": "orders_current", "keys": ["id"], **fields}}


def problems(data: dict[str, Any]) -> list[str]:
    """Every problem of ``data``, each ``file: field: message``."""
    with pytest.raises(SpecError) as refused:
        parse_spec(data, where="flows/orders.yaml")
    assert str(refused.value) == refused.value.problems[0].line  # the first is the message
    return [problem.line for problem in refused.value.problems]


@pytest.mark.parametrize(
    ("expression", "columns"),
    [
        ("source.lsn", ["source.lsn"]),
        ("CAST(updated_at AS BIGINT) * 1000 + _source_offset", ["updated_at", "_source_offset"]),
        ("status = 'deleted' OR note = \"it's nope\"", ["status", "note"]),
        ("status = 'it\\'s' AND r'\\d nope' = status", ["status", "status"]),
        ("`from` + 1 > a.`b c`", ["from", "a.b c"]),
        ("CASE WHEN amount > 0 THEN TRUE ELSE NULL END", ["amount"]),
        (
            "updated_at + INTERVAL 1 DAY > TIMESTAMP '2024-01-01' - INTERVAL '1' HOUR",
            ["updated_at"],
        ),
        (
            "EXTRACT(DOW FROM updated_at) IN (1, 2) AND current_date > DATE '2024-01-01'",
            ["updated_at"],
        ),
        (
            "try_cast(x AS DECIMAL(10, 2)) + CAST(y AS STRUCT<z: INT>).z + w::bigint",
            ["x", "y", "w"],
        ),
        ("transform(tags, t -> upper(t)) = map_filter(m, (k, v) -> v > 0)", ["tags", "m"]),
        ("raw:path.field::int > 0 AND m['key'] > 0 AND arr[0] > 0", ["raw", "m", "arr"]),
        ("0x1F + 1L + 1.5e3D + X'0A' -- nope\n + /* nope */ id", ["id"]),
        ("user = current_user AND timestampadd(HOUR, 1, ts) > current_timestamp()", ["ts"]),
        ("sum(a) OVER (PARTITION BY k ORDER BY t ROWS UNBOUNDED PRECEDING)", ["a", "k", "t"]),
        ("s COLLATE UTF8_LCASE = 'x' AND f(arg => v)", ["s", "v"]),
    ],
)
def test_the_columns_an_expression_names(expression: str, columns: list[str]) -> None:
    assert [str(r) for r in column_references(expression)] == columns


def test_a_debezium_sequence_over_source_lsn_is_refused_naming_the_column() -> None:
    [problem] = problems(spec(current(sequence_by="source.lsn")))
    assert problem.startswith(
        "flows/orders.yaml: silver.current.sequence_by: 'source.lsn' names column 'source', which "
        "is neither a column of schema (columns of schema: id, amount, status, updated_at, addr)"
    )
    assert "nor a metadata column (_op, _source_topic" in problem
    assert "Debezium's source.lsn is the metadata column _source_lsn" in problem
    assert problem.endswith("give a column or an expression over them")


@pytest.mark.parametrize(
    "sequence",
    [
        "CAST(updated_at AS BIGINT) * 1000 + _source_offset",
        "coalesce(_source_lsn, _source_ts_ms)",
        "unix_millis(UPDATED_AT)",  # Spark resolves names without case
        "addr.city",  # a struct's field
    ],
)
def test_a_sequence_expression_over_known_columns_is_accepted(sequence: str) -> None:
    loaded = parse_spec(spec(current(sequence_by=sequence)))
    assert loaded.silver is not None and loaded.silver.sequence_expression == sequence


@pytest.mark.parametrize("metadata", ["_event_time", "_batch_id", "_sequence", "_event_date"])
def test_a_sequence_may_not_read_metadata_added_after_it(metadata: str) -> None:
    """The parse computes ``_sequence`` before these exist (Spark would not resolve them)."""
    [problem] = problems(spec(current(sequence_by=f"{metadata} + 1")))
    assert f"silver.current.sequence_by: '{metadata} + 1' names column '{metadata}'" in problem


def test_a_json_sequence_may_not_read_the_always_null_debezium_metadata() -> None:
    json = spec({"format": "json", **current(sequence_by="_source_lsn")})
    [problem] = problems(json)
    assert "silver.current.sequence_by: '_source_lsn' is neither" in problem
    assert "_source_ts_ms and _source_lsn are null in format json" in problem


def test_a_string_literal_names_no_column() -> None:
    delete = "status = 'cancelled by customer' OR status LIKE 'deleted%'"
    loaded = parse_spec(spec({"format": "json", **current(delete_when=delete)}))
    assert loaded.silver is not None and loaded.silver.delete_condition == delete


def test_delete_when_and_expectations_name_known_columns() -> None:
    data = spec(
        {
            "format": "json",
            **current(delete_when="is_deleted OR status = 'gone'"),
            "expectations": [
                {"name": "positive", "expr": "amount > 0 AND _event_time IS NOT NULL"},
                {"name": "typo", "expr": "amont >= 0 AND nope IS NULL"},
            ],
        }
    )
    assert problems(data) == [
        "flows/orders.yaml: silver.current.delete_when: \"is_deleted OR status = 'gone'\" names "
        "column 'is_deleted', which is neither a column of schema (columns of schema: id, amount, "
        "status, updated_at, addr) nor a metadata column (_op, _source_topic, _source_partition, "
        "_source_offset, _source_timestamp, _source_ts_ms, _source_lsn, _ingested_at); give a "
        "column or an expression over them",
        "flows/orders.yaml: silver.expectations.1.expr: 'amont >= 0 AND nope IS NULL' names "
        "columns 'amont', 'nope', which are neither a column of schema (columns of schema: id, "
        "amount, status, updated_at, addr) nor a metadata column (_op, _sequence, _event_time, "
        "_event_date, _source_topic, _source_partition, _source_offset, _source_timestamp, "
        "_source_ts_ms, _source_lsn, _ingested_at, _batch_id); 'amont' is close to column "
        "'amount'; give a column or an expression over them",
    ]


def test_a_spec_reports_every_problem_not_the_first() -> None:
    """Field errors of several sections, and several column problems of one validator."""
    data = spec(
        current(keys=["id", "idd"], sequence_by="source.lsn", z_order_by=["nope"]),
        trigger={"mode": "sometimes"},
    )
    data["target"]["partition_by"] = ["region"]
    assert [line.split(": ")[1] for line in problems(data)] == [
        "target.partition_by",
        "trigger.mode",
        "silver.current.keys",
        "silver.current.sequence_by",
        "silver.current.z_order_by",
    ]


def test_every_unknown_key_is_named_and_the_other_fields_still_checked() -> None:
    data = spec(current(sequnce_by="x"), trigerr={"mode": "continuous"}, gld=[])
    data["target"]["partition_by"] = ["region"]
    assert [line.split(": ", 2)[1:] for line in problems(data)] == [
        ["target.partition_by", "bronze can be partitioned by ingest_date, topic, not 'region'"],
        ["silver.current.sequnce_by", "unknown field; allowed: table, path, change_data_feed, "
         "deletion_vectors, column_mapping, properties, z_order_by, cluster_by, suite, keys, "
         "sequence_by, delete_when, ignore_null_updates, columns, except_columns, "
         "deleted_key_retention, partition_by"],
        ["trigerr", "unknown field; allowed: name, description, domain, owners, tags, source, "
         "target, trigger, silver, gold, maintenance"],
        ["gld", "unknown field; allowed: name, description, domain, owners, tags, source, target, "
         "trigger, silver, gold, maintenance"],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "layout", "message"),
    [
        ("events", {"z_order_by": ["_event_date"]}, "'_event_date' is a partition column of the events table"),
        ("events", {"z_order_by": ["nope"]}, "'nope' is not a column of the events table (id,"),
        ("quarantine", {"cluster_by": ["id"]}, "'id' is not a column of the quarantine table (flow,"),
        ("current", {"keys": ["id"], "cluster_by": ["nope"]}, "'nope' is not a column of the current table"),
    ],
)  # fmt: skip
def test_layout_columns_are_the_tables(table: str, layout: dict[str, Any], message: str) -> None:
    [problem] = problems(spec({table: {"table": f"orders_{table}", **layout}}))
    assert f"silver.{table}.{next(iter(layout.keys() - {'keys'}))}: {message}" in problem


GOLD = {"table": "gold_orders", "allowed_lateness": "10 minutes"}


def test_gold_z_order_and_join_conditions_name_their_columns() -> None:
    aggregate = {
        **GOLD,
        "window": {"duration": "5 minutes"},
        "aggregates": [{"name": "total", "function": "sum", "column": "amount"}],
        "z_order_by": ["total", "_event_date", "nope"],
    }
    found = problems(spec(gold=[aggregate]))
    assert [line.split(": ")[1] for line in found] == ["gold.0.z_order_by", "gold.0.z_order_by"]
    assert "'_event_date' partitions gold tables" in found[0]
    assert "'nope' is not a column of the gold table (window_start, window_end, total" in found[1]
    join = {
        "table": "gold_pairs",
        "allowed_lateness": "10 minutes",
        "join": {
            "keys": ["id"],
            "left": {"event_time": "updated_at", "where": "amount > 0 AND regoin = 'eu'"},
            "right": {"event_time": "updated_at", "where": "lower(status) = 'paid'"},
            "within": {"after": "1 hour"},
        },
    }
    [problem] = problems(spec(gold=[join]))
    assert (
        "gold.0.join.left.where: \"amount > 0 AND regoin = 'eu'\" names column 'regoin', "
        in problem
    )
    assert "which is neither a column of the events of flow orders" in problem


def test_a_join_condition_on_another_flows_events_is_checked_with_the_folder(
    tmp_path: Path,
) -> None:
    payments = spec(name="payments")
    payments["target"]["table"] = "bronze_payments"
    payments["silver"]["schema"] = "payment_id BIGINT, id BIGINT, paid_at TIMESTAMP"
    join = {
        "table": "gold_paid",
        "allowed_lateness": "10 minutes",
        "join": {
            "keys": ["id"],
            "left": {"event_time": "updated_at"},
            "right": {"flow": "payments", "event_time": "paid_at", "where": "paid_at > updatd_at"},
            "within": {"after": "1 hour"},
        },
    }
    (tmp_path / "orders.yaml").write_text(yaml.safe_dump(spec(gold=[join])))
    (tmp_path / "payments.yaml").write_text(yaml.safe_dump(payments))
    [problem] = check_specs(tmp_path).problems
    assert problem.file == str(tmp_path / "orders.yaml")
    assert "gold.0.join.right.where: 'paid_at > updatd_at' names column 'updatd_at'" in problem.line
    assert "columns of the events of flow payments: payment_id, id, paid_at" in problem.line
    with pytest.raises(SpecError, match=r"gold\.0\.join\.right\.where: "):
        load_specs(tmp_path)  # the other commands stop at the first problem

"""The schema-change policy without Spark: the spec, type inference, column names, messages and
the Dagster check."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetCheckSeverity, AssetKey

from pipelines.silver.schema_changes import (
    MISSING_COLUMNS,
    SCHEMA_MISMATCH,
    UNDECLARED_COLUMNS,
    addable_columns,
    column_type,
    failing_prefixes,
    failure_message,
    widened,
)
from pipelines.spec import SpecError, parse_spec
from quality.checks import SCHEMA_CHANGES, StreamChecks


def silver_spec(fmt: str = "json", **policy: str) -> Any:
    spec = parse_spec(
        {
            "name": "orders",
            "source": {"kind": "kafka", "topics": ["orders"]},
            "target": {"table": "bronze_orders"},
            "silver": {
                "format": fmt,
                "schema": "id BIGINT, amount DOUBLE",
                **({"schema_changes": policy} if policy else {}),
            },
        },
        "flows/orders.yaml",
    )
    return spec


def test_defaults_evolve_new_columns_and_quarantine_what_is_not_additive() -> None:
    json_silver = silver_spec().silver
    assert json_silver.schema_changes.new_columns == "evolve"
    assert json_silver.schema_changes.type_changes == "quarantine"
    assert json_silver.missing_columns == "allow"  # optional JSON fields are left out
    assert silver_spec("debezium").silver.missing_columns == "quarantine"  # images carry all
    assert silver_spec("debezium", missing_columns="allow").silver.missing_columns == "allow"
    assert failing_prefixes(json_silver) == ()


def test_rescue_adds_the_rescued_data_column_which_a_schema_may_not_declare() -> None:
    rescuing = silver_spec(new_columns="rescue").silver
    assert rescuing.columns() == ("id", "amount", "_rescued_data")
    assert rescuing.declared_columns() == ("id", "amount")
    with pytest.raises(SpecError, match=r"_rescued_data.*clashes with a column silver adds"):
        parse_spec(
            {
                "name": "orders",
                "source": {"kind": "kafka", "topics": ["orders"]},
                "target": {"table": "bronze_orders"},
                "silver": {"format": "json", "schema": "id BIGINT, _rescued_data STRING"},
            }
        )


def test_an_unknown_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(SpecError, match=r"schema_changes.new_columns.*evolve.*rescue"):
        silver_spec(new_columns="merge")


def test_fail_policies_name_the_reasons_that_stop_the_flow() -> None:
    silver = silver_spec(
        "debezium", new_columns="fail", missing_columns="fail", type_changes="fail"
    ).silver
    assert failing_prefixes(silver) == (SCHEMA_MISMATCH, MISSING_COLUMNS, UNDECLARED_COLUMNS)
    message = failure_message("orders", "flows/orders.yaml", 7, 2, '{"offset": 4}', silver)
    assert "silver batch 7: 2 record(s) changed schema" in message
    assert "type_changes: fail, missing_columns: fail, new_columns: fail" in message
    assert '{"offset": 4}' in message and "flows/orders.yaml" in message


@pytest.mark.parametrize(
    ("inferred", "column"),
    [
        ("BIGINT", "BIGINT"),
        ("INT", "BIGINT"),
        ("DECIMAL(3,0)", "BIGINT"),
        ("DECIMAL(21,1)", "DOUBLE"),  # 1.5 and 2 together
        ("DECIMAL(38,0)", "DOUBLE"),  # beyond a BIGINT
        ("DOUBLE", "DOUBLE"),
        ("BOOLEAN", "BOOLEAN"),
        ("STRING", "STRING"),
        ("VOID", "STRING"),  # only nulls so far
        ("VARIANT", "STRING"),  # 5 and "7": mixed types keep their JSON text
        ("OBJECT<a: ARRAY<BIGINT>>", "STRING"),
        ("ARRAY<STRING>", "STRING"),
        ("DATE", "STRING"),
    ],
)
def test_evolved_column_types(inferred: str, column: str) -> None:
    assert column_type(inferred) == column


def test_only_fields_that_can_be_column_names_evolve() -> None:
    addable, skipped = addable_columns(
        ["coupon", "Amount", "_private", "2024-01-01", "has space", "points", "POINTS"],
        ["id", "amount", "_op"],
    )
    assert addable == ["coupon", "points"]
    assert skipped == ["Amount", "_private", "2024-01-01", "has space", "POINTS"]


def test_widened_spec_parses_evolved_columns_not_declared_already() -> None:
    silver = silver_spec().silver
    wider = widened(silver, "`coupon` STRING, `AMOUNT` STRING, `points` BIGINT")
    assert wider.declared_columns() == ("id", "amount", "coupon", "points")
    assert widened(silver, "") is silver


def test_the_check_warns_on_quarantined_changes_lists_evolved_columns_and_fails_on_a_stop() -> None:
    checks = StreamChecks(silver_spec(), AssetKey("orders_events"))

    def batch(batch_id: int, **quality: Any) -> dict[str, Any]:
        counts = {"rows_in": 1, "events": 1, "written": 1, "quarantined": 0, "ignored": 0}
        return {"batch_id": batch_id, "input_rows": 1, "quality": {**counts, **quality}}

    checks.add(batch(0, columns_added=["coupon STRING"]))
    schema = next(e for e in checks.evaluations() if e.check_name == SCHEMA_CHANGES)
    assert schema.passed and schema.metadata["columns_added"].value == ["coupon STRING"]
    assert "columns evolved: coupon STRING" in (schema.description or "")
    checks.add(batch(1, schema_mismatches=2))
    schema = next(e for e in checks.evaluations() if e.check_name == SCHEMA_CHANGES)
    assert not schema.passed and schema.metadata["failed_rows"].value == 2
    assert schema.severity == AssetCheckSeverity.WARN  # quarantined: the stream goes on
    checks.fail_schema_change("SchemaChangeError: ...")
    schema = next(e for e in checks.evaluations() if e.check_name == SCHEMA_CHANGES)
    assert schema.metadata["last_batch"].value == {"error": "SchemaChangeError: ..."}
    assert schema.severity == AssetCheckSeverity.ERROR  # a fail policy stopped the stream


def test_a_stop_alone_fails_the_check() -> None:
    checks = StreamChecks(silver_spec(type_changes="fail"), AssetKey("orders_events"))
    checks.fail_schema_change("SchemaChangeError: ...")
    schema = next(e for e in checks.evaluations() if e.check_name == SCHEMA_CHANGES)
    assert not schema.passed and schema.severity == AssetCheckSeverity.ERROR

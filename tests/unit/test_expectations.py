"""Row expectations without Spark: rule arguments, the spec, the fail message, the Dagster checks."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetCheckSeverity, AssetKey

from pipelines.silver.expectations import failed_expectations, failure_message
from pipelines.spec import Expectation, SpecError, parse_spec
from quality.checks import CheckTotals, batch_evaluations, run_results, stream_check_specs
from quality.rules import RULES, RuleError, check_rule_args, signature


def spec_with(expectations: list[dict[str, Any]]) -> Any:
    return parse_spec(
        {
            "name": "orders",
            "source": {"kind": "kafka", "topics": ["orders"]},
            "target": {"table": "bronze_orders"},
            "silver": {
                "format": "json",
                "schema": "id BIGINT, amount DOUBLE, status STRING, created_at TIMESTAMP",
                "expectations": expectations,
            },
        },
        "flows/orders.yaml",
    )


@pytest.mark.parametrize(
    ("rule", "args"),
    [
        ("not_null", {"column": "id"}),
        ("not_empty", {"column": "status"}),
        ("values_in_set", {"column": "status", "values": ["new", "paid"]}),
        ("between", {"column": "amount", "min": 0}),
        ("between", {"column": "amount", "max": 10.5}),
        ("matches", {"column": "status", "pattern": "[a-z]+"}),
        ("max_length", {"column": "status", "length": 10}),
        ("not_in_future", {"column": "created_at"}),
        ("not_in_future", {"column": "created_at", "skew": "1 hour"}),
        ("not_before", {"column": "created_at", "earliest": "2000-01-01"}),
    ],
)
def test_valid_rule_arguments_pass(rule: str, args: dict[str, Any]) -> None:
    assert check_rule_args(rule, args)["column"] == args["column"]


@pytest.mark.parametrize(
    ("rule", "args", "message"),
    [
        ("nope", {}, "unknown rule 'nope'; known: between"),
        ("not_null", {}, "column: Field required (not_null(column))"),
        ("not_null", {"column": "a b"}, "'a b' is not a column name"),
        ("not_null", {"column": "id", "extra": 1}, "extra: Extra inputs are not permitted"),
        ("values_in_set", {"column": "s", "values": []}, "values: List should have at least 1"),
        ("values_in_set", {"column": "s", "values": "new"}, "values: Input should be a valid list"),
        ("between", {"column": "amount"}, "give min, max or both"),
        ("matches", {"column": "s", "pattern": "("}, "does not compile"),
        ("max_length", {"column": "s", "length": -1}, "greater than or equal to 0"),
        ("not_in_future", {"column": "t", "skew": "soon"}, "'soon' is not an interval"),
        ("not_before", {"column": "t", "earliest": "yesterday"}, "not an ISO date"),
    ],
)
def test_bad_rule_arguments_name_the_argument_and_the_signature(
    rule: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(RuleError, match="") as error:
        check_rule_args(rule, args)
    assert message in str(error.value)


def test_every_rule_has_a_docstring_and_a_column() -> None:
    for name, rule in RULES.items():
        assert rule.__doc__, name
        assert signature(name).startswith(f"{name}(column"), name


def test_the_spec_takes_expressions_and_rules_and_defaults_to_warn() -> None:
    spec = spec_with(
        [
            {"name": "positive", "expr": "amount > 0", "action": "fail"},
            {"name": "known", "rule": "values_in_set", "args": {"column": "status", "values": ["new"]}},
        ]
    )  # fmt: skip
    assert spec.silver is not None
    positive, known = spec.silver.expectations
    assert (positive.action, known.action) == ("fail", "warn")
    assert known.describe() == "values_in_set(column='status', values=['new'])"
    assert known.columns() == ["status"] and positive.columns() == []


@pytest.mark.parametrize(
    ("expectations", "message"),
    [
        ([{"name": "a"}], "silver.expectations.0: give either expr (SQL) or rule"),
        ([{"name": "a", "expr": "x", "rule": "not_null"}], "not both or neither"),
        ([{"name": "a", "expr": "x", "args": {"column": "id"}}], "only with rule"),
        ([{"name": "a", "expr": "x;"}], "silver.expectations.0.expr"),
        ([{"name": "a", "rule": "nope"}], "silver.expectations.0.rule: unknown rule 'nope'"),
        ([{"name": "a", "rule": "not_null", "args": {"column": "nope"}}], "silver.expectations.0.args.column: 'nope' is neither a column"),
        ([{"name": "a", "expr": "x"}, {"name": "a", "expr": "y"}], "silver.expectations.1.name: 'a' is the name of an earlier"),
        ([{"name": "a", "expr": "x", "action": "stop"}], "silver.expectations.0.action"),
    ],
)  # fmt: skip
def test_bad_expectations_fail_the_spec_naming_the_field(
    expectations: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(SpecError) as error:
        spec_with(expectations)
    assert message in str(error.value)
    assert str(error.value).startswith("flows/orders.yaml: ")


def test_the_fail_message_names_the_rule_shows_a_row_and_the_way_forward() -> None:
    positive = Expectation(name="positive", expr="amount > 0", action="fail")
    message = failure_message(
        "orders", "flows/orders.yaml", 7, [(positive, 2, '{"id":4,"amount":-1.0}')]
    )
    assert message.startswith(
        "flow orders: silver batch 7: expectation positive (amount > 0) failed on 2 row(s); "
        'a failing row: {"id":4,"amount":-1.0}.'
    )
    assert "nothing of the batch was written" in message
    assert "flows/orders.yaml (silver.expectations)" in message and "action to drop" in message
    wrapped = f"StreamingQueryException: [FOREACH_BATCH_USER_FUNCTION_ERROR] ... {message}"
    assert failed_expectations(wrapped, "orders") == ["positive"]
    assert failed_expectations(wrapped, "other") == []


QUALITY = {
    "rows_in": 10,
    "events": 7,
    "quarantined": 2,
    "ignored": 1,
    "passed": 6,
    "warned": 1,
    "dropped": 1,
    "written": 7,
    "expectations": [
        {"name": "known", "action": "drop", "failed": 1, "expectation": "values_in_set(...)"},
        {"name": "domain", "action": "warn", "failed": 0, "expectation": "email LIKE '%'"},
    ],
}


def test_a_batch_report_becomes_one_evaluation_per_check() -> None:
    events = AssetKey(["silver", "orders_events"])
    evaluations = {e.check_name: e for e in batch_evaluations(events, 3, QUALITY)}
    assert set(evaluations) == {"rows_accounted", "expectation_known", "expectation_domain"}
    assert evaluations["rows_accounted"].passed
    assert not evaluations["expectation_known"].passed
    assert evaluations["expectation_known"].severity == AssetCheckSeverity.WARN
    assert evaluations["expectation_known"].metadata["failed_rows"].value == 1
    assert evaluations["expectation_domain"].passed
    unbalanced = {**QUALITY, "rows_in": 11}
    assert not next(iter(batch_evaluations(events, 4, unbalanced))).passed


def test_run_results_cover_every_declared_check() -> None:
    spec = spec_with(
        [
            {"name": "known", "rule": "values_in_set", "args": {"column": "status", "values": ["new"]}, "action": "drop"},
            {"name": "domain", "expr": "status <> ''"},
            {"name": "positive", "expr": "amount > 0", "action": "fail"},
        ]
    )  # fmt: skip
    events = AssetKey(["silver", "orders_events"])
    declared = {s.name for s in stream_check_specs(spec, events)}
    totals = CheckTotals(events)
    totals.add(0, QUALITY)
    totals.add(1, {**QUALITY, "rows_in": 11})
    results = {r.check_name: r for r in run_results(spec, totals)}
    assert set(results) == declared
    assert not results["rows_accounted"].passed
    assert results["rows_accounted"].metadata["unaccounted_batches"].value == [1]
    assert results["expectation_known"].metadata["failed_rows"].value == 2
    assert results["expectation_positive"].passed
    assert results["expectation_positive"].severity == AssetCheckSeverity.ERROR


def test_a_conflux_error_raised_in_a_batch_is_reported_without_the_py4j_traceback() -> None:
    from pipelines.runner import concise_error

    wrapped = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
        'call last):\n  File "pipelines/stages/silver.py", line 441, in write_batch\n'
        "    raise ExpectationFailedError(\n"
        "pipelines.silver.expectations.ExpectationFailedError: flow orders: silver batch 1: "
        "expectation positive (amount > 0) failed on 1 row(s)\n\n=== Streaming Query ===\n"
        "Identifier: orders.silver\nLogical Plan: ..."
    )
    assert concise_error(wrapped) == (
        "ExpectationFailedError: flow orders: silver batch 1: expectation positive (amount > 0) "
        "failed on 1 row(s)"
    )
    spark_error = "[DELTA_TABLE_NOT_FOUND] Delta table `x` doesn't exist."
    assert concise_error(spark_error) == spark_error

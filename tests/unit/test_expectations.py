"""Row expectations without Spark: rule arguments, the spec, the fail message, the Dagster checks."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetCheckSeverity, AssetKey

from pipelines.silver.expectations import failure_message
from pipelines.spec import Expectation, SpecError, parse_spec
from quality.checks import StreamChecks, accounting_problems, stream_check_specs
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
        ([{"name": "a", "expr": "id > 0"}, {"name": "a", "expr": "amount > 0"}], "silver.expectations.1.name: 'a' is the name of an earlier"),
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
    assert message.endswith("[failed expectations: positive]")


QUALITY = {
    "rows_in": 10,
    "events": 7,
    "quarantined": 2,
    "ignored": 1,
    "passed": 6,
    "warned": 1,
    "dropped": 1,
    "schema_mismatches": 0,
    "rescued": 0,
    "written": 7,
    "expectations": [
        {"name": "known", "action": "drop", "failed": 1, "expectation": "values_in_set(...)"},
        {"name": "domain", "action": "warn", "failed": 0, "expectation": "status <> ''"},
        {"name": "positive", "action": "fail", "failed": 0, "expectation": "amount > 0"},
    ],
}


def batch_message(batch_id: int, **changes: Any) -> dict[str, Any]:
    quality = {**QUALITY, **changes.pop("quality", {})}
    return {
        "batch_id": batch_id,
        "input_rows": 10,
        "quality": quality,
        "writes": [
            {"role": "events", "rows": 7, "skipped": False},
            {"role": "quarantine", "rows": 2, "skipped": False},
        ],
        **changes,
    }


def stream_checks() -> StreamChecks:
    spec = spec_with(
        [
            {"name": "known", "rule": "values_in_set", "args": {"column": "status", "values": ["new"]}, "action": "drop"},
            {"name": "domain", "expr": "status <> ''"},
            {"name": "positive", "expr": "amount > 0", "action": "fail"},
        ]
    )  # fmt: skip
    return StreamChecks(spec, AssetKey(["silver", "orders_events"]))


def test_stream_checks_declare_one_check_per_expectation_and_the_accounting() -> None:
    checks = stream_checks()
    declared = {s.name for s in stream_check_specs(checks.spec, checks.events)}
    assert declared == {
        "rows_accounted",
        "schema_changes",
        "expectation_known",
        "expectation_domain",
        "expectation_positive",
    }
    assert {r.check_name for r in checks.results()} == declared


def test_a_failing_batch_stays_failed_for_the_run_and_changes_are_reported_at_once() -> None:
    checks = stream_checks()
    assert checks.add(batch_message(0)) is True  # known failed: a change of status
    clean = {"expectations": [{**e, "failed": 0} for e in QUALITY["expectations"]]}  # type: ignore[attr-defined]
    assert checks.add(batch_message(1, quality={**clean, "dropped": 0})) is False
    evaluations = {e.check_name: e for e in checks.evaluations()}
    known = evaluations["expectation_known"]
    assert not known.passed and known.severity == AssetCheckSeverity.WARN  # not hidden by batch 1
    assert known.metadata["failed_rows"].value == 1
    assert known.metadata["failed_batches"].value == [0]
    assert evaluations["rows_accounted"].passed
    assert evaluations["expectation_positive"].severity == AssetCheckSeverity.ERROR
    assert checks.metadata()["quality_rows_in"].value == 20


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"input_rows": 11}, "the query read 11 rows, the stage counted 10"),
        ({"quality": {"rows_in": 11}}, "11 rows in, but 10 events + quarantined + ignored"),
        ({"writes": [{"role": "events", "rows": 6, "skipped": False}]}, "the events commit added 6 rows, not 7"),
        ({"writes": [{"role": "quarantine", "rows": 1, "skipped": False}]}, "the quarantine commit added 1 rows"),
    ],
)  # fmt: skip
def test_rows_that_do_not_add_up_fail_the_accounting(changes: dict[str, Any], problem: str) -> None:
    checks = stream_checks()
    assert accounting_problems(batch_message(0)) == []
    message = batch_message(3, **changes)
    assert any(problem in p for p in accounting_problems(message)), accounting_problems(message)
    checks.add(message)
    accounted = next(r for r in checks.results() if r.check_name == "rows_accounted")
    assert not accounted.passed and accounted.metadata["failed_batches"].value == [3]


def test_records_of_another_type_warn_the_schema_check() -> None:
    checks = stream_checks()
    assert checks.add(batch_message(0, quality={"schema_mismatches": 1})) is True
    schema = next(e for e in checks.evaluations() if e.check_name == "schema_changes")
    assert not schema.passed and schema.severity == AssetCheckSeverity.WARN
    assert schema.metadata["failed_rows"].value == 1


def test_a_replayed_write_is_not_held_against_the_accounting() -> None:
    replay = batch_message(2, writes=[{"role": "events", "rows": 0, "skipped": True}])
    assert accounting_problems(replay) == []


def test_a_fail_expectation_that_stopped_the_flow_fails_its_check() -> None:
    checks = stream_checks()
    checks.fail_expectation("positive", "flow orders: silver batch 4: ...")
    positive = next(e for e in checks.evaluations() if e.check_name == "expectation_positive")
    assert not positive.passed and positive.severity == AssetCheckSeverity.ERROR


def test_a_table_suite_becomes_the_gx_expectations_it_names() -> None:
    from datetime import UTC, datetime

    from pipelines.spec import TableSuite
    from quality.suites import build_suite

    suite = TableSuite.model_validate(
        {
            "not_null": ["id", "email"],
            "unique": ["id"],
            "values_in_set": {"tier": ["free", "gold"]},
            "between": {"amount": {"min": 0}},
            "row_count": {"min": 1},
            "freshness": {"max_age": "2 hours"},
        }
    )
    built = build_suite("orders", suite, now=datetime(2026, 1, 1, 12, tzinfo=UTC))
    found = [(e.expectation_type, e.configuration.kwargs) for e in built.expectations]
    kinds = [kind for kind, _ in found]
    assert kinds == [
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_unique",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_be_between",
        "expect_table_row_count_to_be_between",
        "expect_column_max_to_be_between",
    ]
    assert found[-1][1]["column"] == "_event_time"
    assert str(found[-1][1]["min_value"]).startswith("2026-01-01")
    compound = build_suite("o", TableSuite.model_validate({"unique": ["a", "b"]}))
    assert [e.expectation_type for e in compound.expectations] == [
        "expect_compound_columns_to_be_unique"
    ]


def test_a_suite_naming_an_unknown_column_fails_the_spec() -> None:
    base = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "silver": {
            "format": "json",
            "schema": "id BIGINT, amount DOUBLE",
            "current": {"table": "orders", "keys": ["id"], "suite": {"not_null": ["nope"]}},
        },
    }
    with pytest.raises(SpecError, match=r"current\.suite: 'nope' is not a column of the current"):
        parse_spec(base, "flows/orders.yaml")
    base["silver"]["current"]["suite"] = {"not_null": ["_sequence"], "row_count": {"min": -1}}  # type: ignore[index]
    with pytest.raises(SpecError, match=r"row_count\.min"):
        parse_spec(base, "flows/orders.yaml")

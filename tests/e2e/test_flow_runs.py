"""Dagster launches flows as real spark-submit applications through Pipes and reports truthfully:
what a run's materialization says is what delta-rs finds in the table, and a Spark failure fails
the run with Spark's own error text."""

from pathlib import Path
from typing import Any

import yaml
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    asset,
    materialize,
)
from pyspark.sql import SparkSession

from assets.definitions import build_definitions
from pipelines.catalog.state import FlowState
from pipelines.settings import load_settings
from pipelines.spec import load_spec
from tests.e2e.bronze_check import assert_exactly_once, bronze_version, read_bronze
from tests.support.dagster_ui import event_text
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker


def write_flow(flows: Path, name: str, topic: str, **target: str) -> None:
    spec = {
        "name": name,
        "source": {"kind": "kafka", "topics": [topic]},
        "target": {"table": f"bronze_{name}", **target},
    }
    (flows / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def materialize_bronze(table: str, instance: DagsterInstance, raise_on_error: bool = True):
    defs = build_definitions()
    return materialize(
        assets=list(defs.assets or []),
        selection=[AssetKey(["bronze", table])],
        resources=defs.resources,
        instance=instance,
        raise_on_error=raise_on_error,
    )


def test_available_now_materialization_matches_the_delta_table(
    conflux_env: Path, kafka_broker: KafkaBroker
) -> None:
    records = order_payloads(3000)
    create_topic(kafka_broker.bootstrap_servers, "e2e_orders", partitions=2)
    produce(kafka_broker.bootstrap_servers, "e2e_orders", records)
    write_flow(conflux_env, "e2e_orders", "e2e_orders")
    table = FlowState.of(load_spec(conflux_env / "e2e_orders.yaml"), load_settings()).table

    with DagsterInstance.ephemeral() as instance:
        result = materialize_bronze("bronze_e2e_orders", instance)
        assert result.success
        [event] = result.asset_materializations_for_node("flow_e2e_orders")
        metadata = {k: v.value for k, v in event.metadata.items()}

        # The table, read by delta-rs, holds exactly what the event says the run wrote.
        rows = read_bronze(table)
        assert metadata["rows_written"] == rows.num_rows == 3000
        assert metadata["delta_version"] == bronze_version(table)
        assert metadata["lag"] == 0
        end = {int(p): int(o) for p, o in metadata["end_offsets"]["e2e_orders"].items()}
        written: dict[int, list[int]] = {}
        for partition, offset in zip(
            rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True
        ):
            written.setdefault(partition, []).append(offset)
        assert {p: max(o) + 1 for p, o in written.items()} == end
        assert {p: len(o) for p, o in written.items()} == end  # offsets 0..end-1, each once
        assert_exactly_once(table, records)

        # A second run has nothing new to read, says so, and leaves the table as it was.
        version = bronze_version(table)
        again = materialize_bronze("bronze_e2e_orders", instance)
        [event] = again.asset_materializations_for_node("flow_e2e_orders")
        assert event.metadata["rows_written"].value == 0
        assert bronze_version(table) == version
        assert read_bronze(table).num_rows == 3000


def test_spark_failure_fails_the_run_with_the_spark_error(
    conflux_env: Path, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The target path is a plain file: Delta refuses it, and Dagster shows Delta's own words."""
    create_topic(kafka_broker.bootstrap_servers, "e2e_failing", partitions=1)
    produce(kafka_broker.bootstrap_servers, "e2e_failing", order_payloads(10))
    occupied = tmp_path / "occupied"
    occupied.write_text("a plain file where the Delta table should go")
    write_flow(conflux_env, "e2e_failing", "e2e_failing", path=str(occupied))
    # What Delta 4.4 says when a table's location is a plain file (DeltaTableBuilder.execute).
    spark_error = f"[DELTA_MISSING_DELTA_TABLE] `{occupied}` is not a Delta table."

    with DagsterInstance.ephemeral() as instance:
        result = materialize_bronze("bronze_e2e_failing", instance, raise_on_error=False)
        assert not result.success
        [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        message = failure.step_failure_data.error.message
        assert "the Spark application exited with code 1" in message
        assert "flows e2e_failing failed to start" in message
        assert spark_error in message, message
        logged = [event_text(r) for r in instance.all_logs(result.run_id)]
        assert any(spark_error in m for m in logged), (
            "the Spark error must be in the run's event log:\n" + "\n".join(logged)
        )
        assert occupied.read_text() == "a plain file where the Delta table should go"


def test_a_silver_flow_materializes_every_table_it_writes(
    conflux_env: Path, kafka_broker: KafkaBroker, spark: SparkSession
) -> None:
    """One run of a flow with a silver stage: bronze, events, current state and quarantine each
    get a materialization whose rows and Delta version are what delta-rs finds; the stream's
    checks (rows accounted, one per expectation) are evaluated per batch and once for the run.

    ``spark``: the GX suites run in this process, on the active session if there is one. Without
    it they would start the worker's JVM with the launched drivers' options (C1 only), and every
    integration module after this one on the worker would run on that JVM (``spark`` re-uses
    it)."""
    from pipelines.catalog.tables import declared_paths
    from tests.support.cdc import (
        ChangeEvent,
        bad_records,
        delivery_order,
        expectation_breakers,
        expected_current_state,
        generate_events,
        records,
        schema_breakers,
    )
    from tests.support.delta_read import delta_table, read_arrow

    delivered = delivery_order(generate_events(200, 11), 11)
    unknown_tier = expectation_breakers()[0]
    type_change = schema_breakers()[0]
    sent = records(delivered) + [
        b.record() for b in (*bad_records()[:2], unknown_tier, type_change)
    ]
    create_topic(kafka_broker.bootstrap_servers, "e2e_customers", partitions=1)
    produce(kafka_broker.bootstrap_servers, "e2e_customers", sent)
    spec = {
        "name": "e2e_customers",
        "source": {"kind": "kafka", "topics": ["e2e_customers"]},
        "target": {"table": "bronze_e2e_customers"},
        "silver": {
            "format": "debezium",
            "schema": "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP",
            "current": {
                "table": "e2e_customers",
                "keys": ["id"],
                "suite": {"blocking": True, "not_null": ["id", "email"], "unique": ["id"]},
            },
            # deliberately wrong: the customers have four tiers; blocks its downstream asset
            "events": {
                "table": "silver_e2e_customers_events",
                "suite": {
                    "blocking": True,
                    "scope": "run",  # the rows this run added
                    "values_in_set": {"tier": ["free"]},
                },
            },
            "expectations": [
                {
                    "name": "known_tier",
                    "rule": "values_in_set",
                    "args": {"column": "tier", "values": ["free", "silver", "gold", "platinum"]},
                    "action": "drop",
                },
                {"name": "email_has_at", "expr": "email LIKE '%@%'"},
            ],
        },
    }
    (conflux_env / "e2e_customers.yaml").write_text(yaml.safe_dump(spec))
    paths = declared_paths(load_spec(conflux_env / "e2e_customers.yaml"), load_settings())
    keys = {
        "bronze": AssetKey(["bronze", "bronze_e2e_customers"]),
        "events": AssetKey(["silver", "silver_e2e_customers_events"]),
        "current": AssetKey(["silver", "e2e_customers"]),
        "quarantine": AssetKey(["quarantine", "silver_e2e_customers_quarantine"]),
    }

    @asset(deps=[keys["current"]])
    def report_on_customers() -> None:
        """Downstream of the current table, whose blocking suite passes: it runs."""

    @asset(deps=[keys["events"]])
    def report_on_events() -> None:
        """Downstream of the events table, whose blocking suite fails: it must not run."""

    with DagsterInstance.ephemeral() as instance:
        defs = build_definitions()
        result = materialize(
            assets=[
                *(defs.assets or []),
                *(defs.asset_checks or []),
                report_on_customers,
                report_on_events,
            ],
            selection=[*keys.values(), report_on_customers.key, report_on_events.key],
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )
        assert not result.success  # the failed blocking suite
        materialized = {m.asset_key for m in result.get_asset_materialization_events()}
        assert AssetKey("report_on_customers") in materialized
        assert AssetKey("report_on_events") not in materialized
        suites = {
            e.asset_key: e
            for e in result.get_asset_check_evaluations()
            if e.check_name == "gx_suite"
        }
        assert suites[keys["current"]].passed
        failed = suites[keys["events"]]
        assert not failed.passed and failed.severity == AssetCheckSeverity.ERROR
        table = failed.metadata["expectations"].value
        assert "expect_column_values_to_be_in_set" in table and "FAILED" in table, table
        assert str(failed.metadata["scope"].value).startswith("rows of run "), failed.metadata
        assert suites[keys["current"]].metadata["scope"].value == "table e2e_customers"
        by_key = {
            e.asset_key: {k: v.value for k, v in e.metadata.items()}
            for e in result.asset_materializations_for_node("flow_e2e_customers")
        }
        assert set(by_key) == set(keys.values())
        for role, key in keys.items():
            table = delta_table(paths[role])
            assert by_key[key]["delta_version"] == table.version(), role
        current = read_arrow(paths["current"], ["id"])  # deletion vectors: QueryBuilder
        assert by_key[keys["bronze"]]["rows_written"] == len(sent)
        assert by_key[keys["quarantine"]]["rows_written"] == 4
        assert sorted(current["id"].to_pylist()) == sorted(expected_current_state(delivered))
        assert by_key[keys["events"]]["quality_dropped"] == 1
        assert by_key[keys["events"]]["quality_rows_in"] == len(sent)
        # the run-scoped suite judged exactly the events this (first) run wrote
        events_written = by_key[keys["events"]]["rows_written"]
        assert suites[keys["events"]].metadata["rows"].value == events_written

        evaluations = result.get_asset_check_evaluations()
        per_check: dict[str, list[Any]] = {}
        for evaluation in evaluations:
            if evaluation.check_name == "gx_suite":
                continue
            assert evaluation.asset_key == keys["events"]
            per_check.setdefault(evaluation.check_name, []).append(evaluation)
        assert set(per_check) == {
            "rows_accounted",
            "schema_changes",
            "expectation_known_tier",
            "expectation_email_has_at",
        }
        # bad_records()[:2] (not UTF-8, truncated JSON) are no schema change; the type change
        # is, quarantined while the stream goes on: a warning
        schema_changes = per_check["schema_changes"]
        assert not schema_changes[-1].passed
        assert schema_changes[-1].severity == AssetCheckSeverity.WARN
        assert schema_changes[-1].metadata["failed_rows"].value == 1
        assert by_key[keys["events"]]["quality_schema_mismatches"] == 1
        # every batch's evaluation, then the run's result: the last one holds the totals
        assert all(e.passed for e in per_check["rows_accounted"])
        assert all(e.passed for e in per_check["expectation_email_has_at"])
        known_tier = per_check["expectation_known_tier"]
        assert len(known_tier) >= 2 and not known_tier[-1].passed
        assert known_tier[-1].severity == AssetCheckSeverity.WARN
        assert known_tier[-1].metadata["failed_rows"].value == 1

        # A second run adds three free-tier customers: the run-scoped suite judges those three
        # only and passes, though the table as a whole still holds other tiers; downstream runs.
        free = [
            ChangeEvent(
                2_000_000_000 + i,
                "c",
                9_300_000_000 + i,
                after={
                    "id": 2_000_000_000 + i,
                    "name": "Free",
                    "email": f"free{i}@example.com",
                    "tier": "free",
                    "updated_at": "2026-01-02T03:04:05.000Z",
                },
            ).record()
            for i in range(3)
        ]
        produce(kafka_broker.bootstrap_servers, "e2e_customers", free)
        # Only the events table's suite: this run asserts nothing of the current table's, and
        # each suite is Spark work of its own.
        events_suite = [
            c
            for c in defs.asset_checks or []
            if {k.asset_key for k in c.check_keys} == {keys["events"]}
        ]
        assert len(events_suite) == 1, defs.asset_checks
        again = materialize(
            assets=[*(defs.assets or []), *events_suite, report_on_events],
            selection=[*keys.values(), report_on_events.key],
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )
        suite = next(
            e
            for e in again.get_asset_check_evaluations()
            if e.check_name == "gx_suite" and e.asset_key == keys["events"]
        )
        assert suite.passed and suite.metadata["rows"].value == 3, suite.metadata
        assert read_arrow(paths["events"], ["id"]).num_rows > 3
        assert AssetKey("report_on_events") in {
            m.asset_key for m in again.get_asset_materialization_events()
        }

"""Dagster launches flows as real spark-submit applications through Pipes and reports truthfully."""

from pathlib import Path

import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from assets.definitions import build_definitions
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


def test_available_now_materialization_carries_rows_version_and_offsets(
    conflux_env: Path, kafka_broker: KafkaBroker
) -> None:
    create_topic(kafka_broker.bootstrap_servers, "e2e_orders", partitions=2)
    produce(kafka_broker.bootstrap_servers, "e2e_orders", order_payloads(3000))
    write_flow(conflux_env, "e2e_orders", "e2e_orders")

    with DagsterInstance.ephemeral() as instance:
        result = materialize_bronze("bronze_e2e_orders", instance)
        assert result.success
        [event] = result.asset_materializations_for_node("bronze_flows")
        metadata = {k: v.value for k, v in event.metadata.items()}
        assert metadata["rows_written"] == 3000
        assert metadata["delta_version"] >= 0
        assert sum(metadata["end_offsets"]["e2e_orders"].values()) == 3000
        assert metadata["lag"] == 0

        # A second run has nothing new to read, and says so.
        again = materialize_bronze("bronze_e2e_orders", instance)
        [event] = again.asset_materializations_for_node("bronze_flows")
        assert event.metadata["rows_written"].value == 0


def test_spark_failure_fails_the_run_with_the_spark_error(
    conflux_env: Path, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    create_topic(kafka_broker.bootstrap_servers, "e2e_failing", partitions=1)
    produce(kafka_broker.bootstrap_servers, "e2e_failing", order_payloads(10))
    not_a_directory = tmp_path / "occupied"
    not_a_directory.write_text("a plain file where the Delta table should go")
    write_flow(conflux_env, "e2e_failing", "e2e_failing", path=str(not_a_directory))

    with DagsterInstance.ephemeral() as instance:
        result = materialize_bronze("bronze_e2e_failing", instance, raise_on_error=False)
        assert not result.success
        failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        message = failures[0].step_failure_data.error.message
        assert "exited with code 1" in message
        assert "flow e2e_failing failed" in message
        logged = [
            r.user_message
            for r in instance.all_logs(result.run_id)
            if r.user_message and "flow e2e_failing failed" in r.user_message
        ]
        assert logged, "the Spark error must be in the run's event log"

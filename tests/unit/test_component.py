"""The ConfluxFlows component, loaded from a YAML instance as dg loads it, and how a flow's run
relays its tables' progress as materializations (no Spark: definitions are built, never run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import AssetKey, AssetMaterialization
from dagster.components.core.component_tree import ComponentTree
from dagster.components.testing import create_defs_folder_sandbox

from assets.component import ConfluxFlows
from assets.launch import FlowTables, ProgressRelay, RunMonitor, pipes_asset_keys
from pipelines.messages import BatchCommitted, FlowStopped, StageStarted, StopReason, TableWrite
from pipelines.settings import PROJECT_ROOT
from pipelines.spec import SpecError, parse_spec
from quality.checks import StreamChecks

BRONZE = AssetKey(["bronze", "bronze_people"])
EVENTS = AssetKey(["silver", "silver_people_events"])
CURRENT = AssetKey(["silver", "people"])
QUARANTINE = AssetKey(["quarantine", "silver_people_quarantine"])

PEOPLE: dict[str, Any] = {
    "name": "people",
    "source": {"kind": "kafka", "topics": ["people_cdc"]},
    "target": {"table": "bronze_people"},
    "silver": {
        "format": "debezium",
        "schema": "id BIGINT, name STRING",
        "events": {"table": "silver_people_events"},
        "quarantine": {"table": "silver_people_quarantine"},
        "current": {"table": "people", "keys": ["id"]},
    },
}
ORDERS: dict[str, Any] = {
    "name": "orders",
    "source": {"kind": "kafka", "topics": ["orders"]},
    "target": {"table": "bronze_orders"},
    "trigger": {"mode": "continuous"},
}


def write_flows(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for spec in (PEOPLE, ORDERS):
        (folder / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    return folder


def asset_keys(defs: Any) -> set[str]:
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def test_component_from_yaml_builds_the_flows_assets(tmp_path: Path) -> None:
    flows = write_flows(tmp_path / "flows")
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=ConfluxFlows,
            defs_yaml_contents={
                "type": "assets.component.ConfluxFlows",
                "attributes": {"flows_dir": str(flows)},
            },
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, ConfluxFlows)
            assert asset_keys(defs) == {
                "kafka/people_cdc",
                "kafka/orders",
                "bronze/bronze_people",
                "silver/silver_people_events",
                "silver/people",
                "quarantine/silver_people_quarantine",
                "bronze/bronze_orders",
            }
            jobs = {job.name for job in defs.jobs or []}
            assert jobs == {
                *("run_people", "run_orders", "ingest_incremental"),
                *("maintain_people", "maintain_orders"),
            }


def test_component_keeps_only_the_listed_flows_from_a_relative_folder() -> None:
    with create_defs_folder_sandbox() as sandbox:
        write_flows(sandbox.project_root / "specs")
        path = sandbox.scaffold_component(
            component_cls=ConfluxFlows,
            defs_yaml_contents={
                "type": "assets.component.ConfluxFlows",
                "attributes": {"flows_dir": "specs", "flows": ["orders"]},
            },
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            assert asset_keys(defs) == {"kafka/orders", "bronze/bronze_orders"}


def test_component_refuses_an_unknown_flow(tmp_path: Path) -> None:
    flows = write_flows(tmp_path / "flows")
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=ConfluxFlows,
            defs_yaml_contents={
                "type": "assets.component.ConfluxFlows",
                "attributes": {"flows_dir": str(flows), "flows": ["nobody"]},
            },
        )
        with (
            pytest.raises(Exception, match="ConfluxFlows") as raised,
            sandbox.load_component_and_build_defs(defs_path=path),
        ):
            pass
    cause = raised.value.__cause__
    assert isinstance(cause, SpecError)
    assert str(cause) == (
        f"flows: no spec in {flows} for nobody; the flows there are: orders, people"
    )


def test_the_projects_instance_reads_the_settings_flows_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``assets/defs/conflux_flows/defs.yaml``, what workspace.yaml and dg load."""
    monkeypatch.setenv("CONFLUX_FLOWS_DIR", str(write_flows(tmp_path / "flows")))
    tree = ComponentTree.for_project(path_within_project=PROJECT_ROOT / "assets")
    component = tree.load_component(Path("conflux_flows"))
    assert isinstance(component, ConfluxFlows)
    assert component.flows_dir is None and component.flows is None
    assert "bronze/bronze_people" in asset_keys(tree.build_defs())


# --- progress of a run, per table ------------------------------------------------------------------


class FakeLog:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warning(self, message: str) -> None:
        self.lines.append(f"WARNING {message}")


class FakeContext:
    def __init__(self) -> None:
        self.events: list[AssetMaterialization] = []
        self.log = FakeLog()

    def log_event(self, event: AssetMaterialization) -> None:
        self.events.append(event)


def batch(stage: str, batch_id: int, writes: list[dict[str, Any]] | None, **extra: Any) -> dict:
    message = {
        "type": "batch",
        "flow": "people",
        "stage": stage,
        "batch_id": batch_id,
        "processed_rows_per_second": 10.0,
        "end_offsets": {},
        "lag": 0 if stage == "bronze" else None,
        **extra,
    }
    if writes is not None:
        message["writes"] = writes
    return message


def write(table: str, role: str, version: int, rows: int, skipped: bool = False) -> dict:
    return {"table": table, "role": role, "version": version, "rows": rows, "skipped": skipped}


def monitor(live: bool, interval: float = 0.0) -> tuple[FakeContext, RunMonitor]:
    context = FakeContext()
    tables = {"people": FlowTables.of(parse_spec(PEOPLE))}
    relays = {
        key: ProgressRelay(context, key, interval)  # type: ignore[arg-type]
        for key in tables["people"].by_role.values()
    }
    return context, RunMonitor(context, tables, relays, 3600.0, live=live)  # type: ignore[arg-type]


def test_each_write_is_a_materialization_of_its_table() -> None:
    context, run = monitor(live=True)
    run.poll(
        [
            batch("bronze", 0, [write("bronze_people", "bronze", 1, 10)]),
            batch(
                "silver",
                0,
                [
                    write("silver_people_events", "events", 1, 8),
                    write("silver_people_quarantine", "quarantine", 1, 2),
                    write("people", "current", 1, 5),
                ],
            ),
        ],
        final=True,
    )
    by_key = {e.asset_key: e.metadata for e in context.events}
    assert set(by_key) == {BRONZE, EVENTS, QUARANTINE, CURRENT}
    assert by_key[EVENTS]["rows_written"].value == 8
    assert by_key[QUARANTINE]["rows_written"].value == 2
    assert by_key[CURRENT]["delta_version"].value == 1
    assert by_key[CURRENT]["stage"].value == "silver"
    assert by_key[BRONZE]["lag"].value == 0
    assert "lag" not in by_key[EVENTS]


def test_progress_is_throttled_per_table() -> None:
    context, run = monitor(live=True, interval=3600.0)
    messages = [batch("bronze", 0, [write("bronze_people", "bronze", 1, 10)])]
    run.poll(messages)
    assert context.events == []  # within the interval
    messages.append(batch("silver", 0, [write("silver_people_events", "events", 1, 10)]))
    messages.append(batch("bronze", 1, [write("bronze_people", "bronze", 2, 5)]))
    run.poll(messages, final=True)
    by_key = {e.asset_key: e.metadata for e in context.events}
    assert by_key[BRONZE]["rows_written"].value == 15
    assert by_key[BRONZE]["batches"].value == 2
    assert by_key[BRONZE]["delta_version"].value == 2
    assert set(by_key) == {BRONZE, EVENTS}  # no write, no materialization


def test_a_bronze_batch_without_writes_is_the_bronze_table_s() -> None:
    """A runner from before silver reports ``delta_version`` / ``rows_added`` / ``replayed``."""
    legacy = batch("bronze", 3, None, delta_version=7, rows_added=4, replayed=True)
    tables = FlowTables.of(parse_spec(PEOPLE))
    assert tables.writes_of(BatchCommitted.parse(legacy)) == [
        (BRONZE, TableWrite("bronze_people", "bronze", 7, 4, True))
    ]
    context, run = monitor(live=True)
    run.poll([legacy], final=True)
    [event] = context.events
    assert event.asset_key == BRONZE
    assert event.metadata["replayed"].value is True
    assert tables.writes_of(BatchCommitted.parse(batch("silver", 3, []))) == []


def test_available_now_keeps_totals_for_the_end_without_live_events() -> None:
    context, run = monitor(live=False)
    run.poll(
        [
            batch("silver", 0, [write("silver_people_events", "events", 3, 8)]),
            batch("silver", 1, [write("silver_people_events", "events", 4, 2, skipped=True)]),
        ],
        final=True,
    )
    assert context.events == []
    totals = run.relays[EVENTS].run_metadata()
    assert totals["rows_written"].value == 10
    assert totals["batches"].value == 2
    assert totals["replayed_batches"].value == 1
    assert totals["delta_version"].value == 4
    assert totals["last_batch_id"].value == 1
    assert run.relays[CURRENT].run_metadata()["rows_written"].value == 0


def test_writes_of_unknown_tables_or_flows_are_ignored() -> None:
    context, run = monitor(live=True)
    other = {**batch("bronze", 0, [write("x", "bronze", 1, 1)]), "flow": "other"}
    run.poll([other, batch("silver", 0, [write("elsewhere", "events", 1, 1)])], final=True)
    assert context.events == []


def test_the_child_is_told_each_table_s_asset_key() -> None:
    """What :meth:`pipelines.reporting.Reporter.finished` looks materializations' keys up in."""
    tables = {
        "people": FlowTables.of(parse_spec(PEOPLE)),
        "orders": FlowTables.of(parse_spec(ORDERS)),
    }
    assert pipes_asset_keys(tables) == {
        "people": "bronze/bronze_people",
        "people/bronze": "bronze/bronze_people",
        "people/events": "silver/silver_people_events",
        "people/quarantine": "quarantine/silver_people_quarantine",
        "people/current": "silver/people",
        "orders": "bronze/bronze_orders",
        "orders/bronze": "bronze/bronze_orders",
    }


def test_a_policy_stop_fails_its_check_from_the_typed_stop_message() -> None:
    """Which expectation stopped the flow comes with the child's stop message, not from the
    error's text; a flow stopped because another failed fails no check of its own."""
    people = parse_spec(
        {
            **PEOPLE,
            "silver": {
                **PEOPLE["silver"],
                "expectations": [{"name": "named", "expr": "name <> ''", "action": "fail"}],
            },
        }
    )
    context, run = monitor(live=False)
    run.checks["people"] = StreamChecks(people, EVENTS)
    message = "flow people.silver failed: ExpectationFailedError: flow people: silver batch 3: ..."
    run.poll(
        [
            {"type": "error", "message": message},
            StageStarted("people", "silver", "people.silver").to_json(),
            FlowStopped(
                "people", StopReason.EXPECTATION_FAILED, message, "people.silver", ("named",)
            ).to_json(),
            FlowStopped("orders", StopReason.OTHER_FLOW_FAILED, message, "people.silver").to_json(),
            {"type": "something new"},
        ],
        final=True,
    )
    assert run.errors == [message]
    assert [s.reason for s in run.stops] == [
        StopReason.EXPECTATION_FAILED,
        StopReason.OTHER_FLOW_FAILED,
    ]
    assert run.started == [StageStarted("people", "silver", "people.silver")]
    assert any("unknown type 'something new'" in line for line in context.log.lines)
    assert run.report_stops() is True
    named = next(e for e in context.events if e.check_name == "expectation_named")
    assert not named.passed and named.metadata["last_batch"].value == {"error": message}


def test_a_crash_is_not_a_policy_stop() -> None:
    context, run = monitor(live=False)
    run.checks["people"] = StreamChecks(parse_spec(PEOPLE), EVENTS)
    run.poll([FlowStopped("people", StopReason.CRASH, "flow people failed: boom").to_json()])
    assert run.report_stops() is False
    assert context.events == []

"""The Dagster workspace loads, and the asset graph is what the flow specs declare.

No Spark here: definitions are built, never run. After a deliberate change to the graph,
regenerate the snapshot with ``python -m tests.e2e.test_definitions`` and review its diff.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, Definitions

from assets import definitions
from assets.definitions import build_definitions
from assets.keys import flow_asset_keys
from pipelines.settings import PROJECT_ROOT
from pipelines.spec import SpecError, load_specs

SNAPSHOT = Path(__file__).parent / "snapshots" / "asset_specs.json"
DG = str(Path(sys.executable).parent / "dg")


def asset_graph_snapshot(defs: Definitions) -> dict[str, dict]:
    graph = defs.resolve_asset_graph()
    snapshot = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        snapshot[key.to_user_string()] = {
            "group": node.group_name,
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "kinds": sorted(node.kinds),
            "executable": node.is_executable,
            "checks": sorted(k.name for k in graph.asset_check_keys if k.asset_key == key),
        }
    return snapshot


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}


def test_workspace_loads_with_the_dagster_cli() -> None:
    env = cli_env()
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "dagster"),
            "definitions",
            "validate",
            "-w",
            "workspace.yaml",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_asset_graph_matches_the_snapshot() -> None:
    """A change to any asset's key, group, deps or kinds must be deliberate: edit the snapshot."""
    defs = build_definitions()
    assert asset_graph_snapshot(defs) == json.loads(SNAPSHOT.read_text())


def test_sources_are_upstream_of_bronze() -> None:
    graph = build_definitions().resolve_asset_graph()
    bronze = graph.get(AssetKey(["bronze", "bronze_orders"]))
    assert AssetKey(["kafka", "orders"]) in bronze.parent_keys
    assert not graph.get(AssetKey(["kafka", "orders"])).is_executable


def test_workspace_loads_the_dg_component_instance() -> None:
    """workspace.yaml's ``defs`` is the ConfluxFlows instance of the dg defs folder: the same graph
    as the builder, every asset traced to ``assets/defs/conflux_flows/defs.yaml``."""
    assert asset_graph_snapshot(definitions.defs) == asset_graph_snapshot(build_definitions())
    graph = definitions.defs.resolve_asset_graph()
    node = graph.get(AssetKey(["bronze", "bronze_orders"]))
    origin = node.metadata["dagster/component_origin"].instance
    assert type(origin).__name__ == "ConfluxFlows"


def test_dg_checks_and_lists_the_project() -> None:
    """`dg` knows the project from pyproject.toml: the component type, and its definitions."""
    components = subprocess.run(
        [DG, "list", "components", "--json"],
        cwd=PROJECT_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert components.returncode == 0, components.stdout + components.stderr
    keys = [item["key"] for item in json.loads(components.stdout)["items"]]
    assert "assets.component.ConfluxFlows" in keys

    check = subprocess.run(
        [DG, "check", "defs"],
        cwd=PROJECT_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "All definitions loaded successfully" in check.stdout + check.stderr

    listed = subprocess.run(
        [DG, "list", "defs", "--json"],
        cwd=PROJECT_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assets = {item["asset_key"] for item in json.loads(listed.stdout)["assets"]}
    assert assets == set(asset_graph_snapshot(build_definitions()))


def write_silver_flow(flows: Path, current: bool = True) -> None:
    silver: dict = {
        "format": "debezium",
        "schema": "id BIGINT, name STRING, updated_at TIMESTAMP",
        "events": {"table": "silver_people_events"},
        "quarantine": {"table": "silver_people_quarantine"},
    }
    if current:
        silver["current"] = {"table": "people", "keys": ["id"]}
    spec = {
        "name": "people",
        "description": "People changes.",
        "source": {"kind": "kafka", "topics": ["people_cdc"]},
        "target": {"table": "bronze_people"},
        "silver": silver,
    }
    (flows / "people.yaml").write_text(yaml.safe_dump(spec))


def test_silver_tables_are_assets_of_the_flow(tmp_path: Path) -> None:
    """bronze -> events -> current, bronze -> quarantine: all in the flow's one multi-asset."""
    write_silver_flow(tmp_path)
    defs = build_definitions(tmp_path)
    graph = defs.resolve_asset_graph()
    bronze = AssetKey(["bronze", "bronze_people"])
    events = AssetKey(["silver", "silver_people_events"])
    current = AssetKey(["silver", "people"])
    quarantine = AssetKey(["quarantine", "silver_people_quarantine"])
    assert graph.get(events).parent_keys == {bronze}
    assert graph.get(current).parent_keys == {events}
    assert graph.get(quarantine).parent_keys == {bronze}
    for key in (events, current, quarantine):
        node = graph.get(key)
        assert node.group_name == "people"  # the flow's domain, by default its name
        assert node.tags["conflux/layer"] == "silver"
        assert node.kinds == {"spark", "delta"}
    assets_def = defs.get_assets_def(bronze)
    assert assets_def.node_def.name == "flow_people"
    assert assets_def.keys == {bronze, events, current, quarantine}
    assert not assets_def.can_subset  # a run is the whole Spark application

    metadata = graph.get(current).metadata
    assert metadata["keys"] == ["id"]
    assert metadata["sequence_by"] == "_source_lsn"
    settings_lake = Path(graph.get(bronze).metadata["table_path"]).parent.parent
    assert metadata["table_path"] == str(settings_lake / "silver" / "people")
    assert graph.get(events).metadata["table_path"] == str(
        settings_lake / "silver" / "silver_people_events"
    )


def test_a_flow_without_a_current_table(tmp_path: Path) -> None:
    write_silver_flow(tmp_path, current=False)
    graph = build_definitions(tmp_path).resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {
        "kafka/people_cdc",
        "bronze/bronze_people",
        "silver/silver_people_events",
        "quarantine/silver_people_quarantine",
    }


def test_jobs_select_every_table_of_their_flows(tmp_path: Path) -> None:
    write_silver_flow(tmp_path)
    defs = build_definitions(tmp_path)
    graph = defs.resolve_asset_graph()
    [spec] = load_specs(tmp_path)
    for job in ("run_people", "ingest_incremental"):
        selected = defs.resolve_job_def(job).asset_layer.selected_asset_keys
        assert selected == set(flow_asset_keys(spec)), job
    assert graph.get(AssetKey(["kafka", "people_cdc"])).is_executable is False


def test_flows_filter_refuses_an_unknown_flow(tmp_path: Path) -> None:
    write_silver_flow(tmp_path)
    with pytest.raises(SpecError) as raised:
        build_definitions(tmp_path, ["nobody"])
    assert (
        str(raised.value) == f"flows: no spec in {tmp_path} for nobody; the flows there are: people"
    )


if __name__ == "__main__":  # regenerate the snapshot: review the diff before committing it
    SNAPSHOT.write_text(
        json.dumps(asset_graph_snapshot(build_definitions()), indent=2, sort_keys=True) + "\n"
    )
    print(f"wrote {SNAPSHOT}")

"""The Dagster workspace loads, and the asset graph is what the flow specs declare."""

import json
import os
import subprocess
import sys
from pathlib import Path

from dagster import AssetKey, Definitions

from assets.definitions import build_definitions
from pipelines.settings import PROJECT_ROOT

SNAPSHOT = Path(__file__).parent / "snapshots" / "asset_specs.json"


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
        }
    return snapshot


def test_workspace_loads_with_the_dagster_cli() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
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

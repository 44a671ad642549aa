"""The catalog is the one place that derives a flow's tables and state: pinned against what the
code derived before the catalog existed (``snapshots/catalog.json``, generated from the previous
commit's ``table_paths`` / ``flow_tables`` / ``flow_table_keys`` / ``FlowLocations`` and the
stages' app ids), for every demo flow. A difference here means existing tables, checkpoints or
Dagster assets would no longer be found: never regenerate it to make a test pass."""

import json
from pathlib import Path

import pytest

from assets.keys import flow_table_keys
from pipelines.catalog.roles import Layer, TableRole, parse_role_id, role_id
from pipelines.catalog.tables import FlowCatalog
from pipelines.identity import FlowIdentity
from pipelines.location import Location
from pipelines.settings import PROJECT_ROOT, Settings
from pipelines.spec import load_specs

SNAPSHOT = json.loads((Path(__file__).parent / "snapshots" / "catalog.json").read_text())
ROOT = Path("/RUNTIME")
SETTINGS = Settings(runtime_dir=ROOT, jars_dir=ROOT / "jars", flows_dir=PROJECT_ROOT / "flows")
SPECS = {spec.name: spec for spec in load_specs(PROJECT_ROOT / "flows")}


def rel(path: Location | Path | str) -> str:
    return str(path).replace(str(ROOT), "<runtime>")


def test_every_demo_flow_is_pinned() -> None:
    assert sorted(SPECS) == sorted(SNAPSHOT)


@pytest.mark.parametrize("flow", sorted(SNAPSHOT))
def test_tables_locations_and_order_are_unchanged(flow: str) -> None:
    catalog = FlowCatalog.of(SPECS[flow], SETTINGS)
    pinned = SNAPSHOT[flow]
    tables = {
        t.id: {
            "table": t.name,
            "path": rel(t.path),
            "spec_field": t.spec_field,
            "z_order_by": list(t.z_order_by),
        }
        for t in catalog
    }
    assert list(tables) == list(pinned["tables"])  # maintenance's order
    assert tables == pinned["tables"]
    declared = {t.id: rel(t.path) for t in catalog.declared}
    assert declared == pinned["table_paths"]


@pytest.mark.parametrize("flow", sorted(SNAPSHOT))
def test_asset_keys_are_unchanged(flow: str) -> None:
    keys = {k: v.to_user_string() for k, v in flow_table_keys(SPECS[flow]).items()}
    assert keys == SNAPSHOT[flow]["asset_keys"]
    catalog = FlowCatalog.of(SPECS[flow], SETTINGS)
    from_catalog = {t.id: "/".join(t.asset_key_path or ()) for t in catalog.declared}
    assert from_catalog == keys


@pytest.mark.parametrize("flow", sorted(SNAPSHOT))
def test_transaction_app_ids_are_unchanged(flow: str) -> None:
    """Exactly once rests on these: a changed app id makes Delta replay committed batches."""
    spec = SPECS[flow]
    identity = FlowIdentity(flow, "FID", spec.target.table, "x", 2, "t", silver_generation=0)
    catalog = FlowCatalog.of(spec, SETTINGS)
    ids: dict[str, str] = {}
    for table in catalog:
        if table.role is TableRole.BACKFILLS:
            continue  # written outside any stream, with no transaction id
        key = "bronze" if table.role is TableRole.BRONZE else table.name
        ids[key] = table.app_id(identity)
        if table.layer is Layer.SILVER and not table.is_side_table:
            ids[f"{table.name}@s3"] = table.app_id(identity, silver_generation=3)
    for gold in spec.gold:
        ids[f"quarantine-gold-{gold.table}"] = catalog.gold_quarantine_app_id(
            identity, gold.table, "EPOCH"
        )
    assert ids == SNAPSHOT[flow]["app_ids"]


@pytest.mark.parametrize("flow", sorted(SNAPSHOT))
def test_flow_state_is_where_it_was(flow: str) -> None:
    spec = SPECS[flow]
    state = FlowCatalog.of(spec, SETTINGS).state
    found = {
        "flow_dir": state.flow_dir,
        "bronze_checkpoint": state.checkpoint,
        "schema_file": state.schema_file,
        "identity": state.identity_file,
        "lease": state.lease_dir,
        "control": state.control_dir,
        "stop_owner": state.stop_file("OWNER"),
        "status": state.status_file,
        "health": state.health_file,
        "archive": state.archive_dir,
        "silver_checkpoint": state.silver_checkpoint,
    }
    for gold in spec.gold:
        found[f"gold.{gold.table}"] = state.gold_checkpoint(gold.table)
        found[f"gold.{gold.table}.split"] = state.gold_checkpoint(gold.table, split=True)
    assert {k: rel(v) for k, v in found.items()} == SNAPSHOT[flow]["state"]


def test_table_ids_round_trip_and_refuse_what_is_not_one() -> None:
    for role in TableRole:
        gold = "revenue" if role.per_gold_table else None
        assert parse_role_id(role_id(role, gold)) == (role, gold)
    for bad in ("gold", "events/x", "nothing"):
        with pytest.raises(ValueError):
            parse_role_id(bad)


def test_side_tables_sit_beside_their_table_and_have_no_asset() -> None:
    catalog = FlowCatalog.of(SPECS["orders"], SETTINGS)
    for table in catalog:
        if table.is_side_table:
            assert table.asset_key_path is None
            [main] = [
                t
                for t in catalog.declared
                if t.gold == table.gold
                and t.path == Location.local(str(table.path).rsplit("__", 1)[0])
            ]
            assert main.layer is table.layer
    gold = catalog.table(TableRole.GOLD, "revenue_10m")
    assert [t.role for t in catalog.side_tables(gold)] == [
        TableRole.GOLD_INPUT,
        TableRole.BACKFILLS,
    ]
    revenue = catalog.of_gold("revenue_10m")
    assert [t.role for t in revenue] == [
        TableRole.GOLD,
        TableRole.GOLD_INPUT,
        TableRole.BACKFILLS,
        TableRole.LATE,
    ]
    assert catalog.table(TableRole.GOLD_INPUT, "revenue_10m").writer == "gold.revenue_10m.split"

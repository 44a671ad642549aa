"""Flow identity: the checkpoint and the table must agree on their flow (no JVM)."""

from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.catalog.state import FlowState
from pipelines.identity import (
    FLOW_ID_PROPERTY,
    FLOW_PROPERTY,
    GENERATION_PROPERTY,
    IdentityError,
    read_identity,
    reset_flow,
    resolve_identity,
    write_identity,
)
from pipelines.lease import FileLeaseStore, FlowLease, LeaseHeldError
from pipelines.settings import Settings
from pipelines.spec import parse_spec


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(runtime_dir=tmp_path, jars_dir=tmp_path / "jars")


def spec(name: str = "orders", table: str = "bronze_orders"):
    return parse_spec(
        {"name": name, "source": {"kind": "kafka", "topics": ["o"]}, "target": {"table": table}},
        where=f"flows/{name}.yaml",
    )


def commit_a_batch(locations: FlowState) -> None:
    (locations.checkpoint / "commits").mkdir(parents=True)
    (locations.checkpoint / "commits" / "0").write_text("v1")


def test_a_new_flow_gets_an_identity_and_stamps_its_table(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, stamp = resolve_identity(spec(), locations, None)
    assert stamp and identity.flow == "orders" and identity.generation == 0
    write_identity(locations, identity)
    again, stamp = resolve_identity(spec(), locations, identity.table_properties())
    assert again == identity and not stamp
    assert identity.txn_app_id == f"conflux-{identity.flow_id}-g0"


def test_a_renamed_flow_is_refused_with_the_way_out(settings: Settings) -> None:
    old = FlowState.of(spec("orders"), settings)
    identity, _ = resolve_identity(spec("orders"), old, None)
    renamed = spec("orders_v2")
    with pytest.raises(IdentityError) as error:
        resolve_identity(renamed, FlowState.of(renamed, settings), identity.table_properties())
    message = str(error.value)
    assert "belongs to flow orders" in message and "rename it back" in message
    assert "conflux reset orders_v2" in message


def test_a_deleted_checkpoint_beside_its_table_is_refused(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    with pytest.raises(IdentityError, match=r"checkpoint .* has no committed batch, but the table"):
        resolve_identity(spec(), locations, identity.table_properties())


def test_a_lost_identity_file_is_rebuilt_from_the_table(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    commit_a_batch(locations)  # identity.json never written (or lost), the checkpoint committed
    rebuilt, stamp = resolve_identity(spec(), locations, identity.table_properties())
    assert not stamp and rebuilt.txn_app_id == identity.txn_app_id


def test_a_restored_older_generation_is_named(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    write_identity(locations, identity)
    newer = {**identity.table_properties(), GENERATION_PROPERTY: "2"}
    with pytest.raises(IdentityError, match="last written by generation 2 of this flow"):
        resolve_identity(spec(), locations, newer)


def test_a_deleted_table_with_committed_batches_is_refused(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    write_identity(locations, identity)
    commit_a_batch(locations)
    with pytest.raises(IdentityError, match=r"table .* is missing"):
        resolve_identity(spec(), locations, None)


def test_a_table_owned_by_another_flow_id_is_refused(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    write_identity(locations, identity)
    foreign = {FLOW_PROPERTY: "other", FLOW_ID_PROPERTY: "f" * 32, GENERATION_PROPERTY: "0"}
    with pytest.raises(IdentityError, match="is owned by flow other"):
        resolve_identity(spec(), locations, foreign)


def test_a_changed_target_is_refused(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    write_identity(locations, identity)
    moved = spec(table="bronze_orders_v2")
    with pytest.raises(IdentityError, match="target: the checkpoint was written for table"):
        resolve_identity(moved, FlowState.of(moved, settings), None)


def test_a_foreign_table_is_refused_unless_a_legacy_checkpoint_owns_it(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    with pytest.raises(IdentityError, match="no Conflux flow wrote"):
        resolve_identity(spec(), locations, {})
    commit_a_batch(locations)  # a flow from before identities were recorded: adopted
    identity, stamp = resolve_identity(spec(), locations, {})
    assert stamp and identity.flow == "orders"


def test_reset_archives_the_checkpoint_and_bumps_the_generation(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    identity, _ = resolve_identity(spec(), locations, None)
    write_identity(locations, identity)
    commit_a_batch(locations)
    table = identity.table_properties()

    reset = reset_flow(spec(), locations)
    assert reset.generation == 1 and reset.flow_id == identity.flow_id
    assert reset.txn_app_id != identity.txn_app_id
    assert not locations.checkpoint.exists()
    assert [p.name.split("-g0-")[0] for p in locations.archive_dir.path.iterdir()] == [
        "bronze_orders"
    ]
    adopted, stamp = resolve_identity(spec(), locations, table)
    assert stamp and adopted == replace(reset, adopt_table=False)
    assert read_identity(locations) == reset


def test_reset_is_refused_while_the_flow_runs(settings: Settings) -> None:
    locations = FlowState.of(spec(), settings)
    FlowLease("orders", FileLeaseStore(locations.lease_dir.path), "cli-1").acquire()
    with pytest.raises(LeaseHeldError, match="flow orders is already running"):
        reset_flow(spec(), locations)

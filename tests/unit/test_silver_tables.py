"""Silver tables against the spec and the checkpoint: what continues, what is refused (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines.catalog.lifecycle import TableDesign, check_table, reset_stage, schema_changes
from pipelines.catalog.roles import TableRole
from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import CatalogTable, check_distinct_tables
from pipelines.identity import FlowIdentity, IdentityError
from pipelines.lease import FileLeaseStore, FlowLease, LeaseHeldError
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.silver.tables import KEYS_PROPERTY, SEQUENCE_PROPERTY
from pipelines.spec import SpecError, parse_spec

IDENTITY = FlowIdentity("customers", "f1", "bronze_customers", "/lake/b", 2, "2026-01-01")
SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])
DESIGN = TableDesign(
    entry=CatalogTable(
        TableRole.CURRENT,
        "customers",
        Location.local("/lake/silver/customers"),
        "silver.current",
        "silver",
    ),
    path="/lake/silver/customers",
    schema=SCHEMA,
    spec_properties={KEYS_PROPERTY: "id", SEQUENCE_PROPERTY: "_source_lsn"},
    spec_field="silver.current",
)
STAMPED = {**IDENTITY.table_properties(), KEYS_PROPERTY: "id", SEQUENCE_PROPERTY: "_source_lsn"}


def check(
    properties: dict[str, str] | None = STAMPED,
    schema: StructType | None = SCHEMA,
    partitions: tuple[str, ...] = (),
    has_data: bool = True,
    committed: bool = True,
) -> str:
    return check_table(
        DESIGN, IDENTITY, properties, schema, partitions, has_data, committed, "flows/c.yaml"
    )


def test_a_matching_table_continues_and_a_new_one_is_created() -> None:
    assert check() == "ok"
    assert check(properties=None, schema=None, committed=False) == "create"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"properties": {**STAMPED, KEYS_PROPERTY: "email"}}, "keys changed from 'email' to 'id'"),
        (
            {"properties": {**STAMPED, SEQUENCE_PROPERTY: "_source_ts_ms"}},
            "sequenceBy changed from '_source_ts_ms' to '_source_lsn'",
        ),
        (
            {"schema": StructType([*SCHEMA.fields, StructField("tier", StringType())])},
            "column tier was removed",
        ),
        (
            {"schema": StructType([StructField("id", StringType()), SCHEMA["name"]])},
            "column id changed type from string to bigint",
        ),
        ({"partitions": ("name",)}, "partitioning changed from ['name'] to []"),
    ],
)
def test_an_incompatible_spec_change_names_the_change_and_the_way_forward(
    kwargs: dict, expected: str
) -> None:
    with pytest.raises(IdentityError) as refused:
        check(**kwargs)
    message = str(refused.value)
    assert message.startswith("flows/c.yaml: silver.current: the current table customers")
    assert expected in message
    assert "conflux reset customers --stage silver" in message


def test_an_added_column_is_not_a_conflict() -> None:
    narrower = StructType([SCHEMA["id"]])
    assert check(schema=narrower) == "ok"
    problems, added = schema_changes(narrower, SCHEMA)
    assert problems == [] and [f.name for f in added] == ["name"]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"properties": None, "schema": None},
            "is missing, but the silver checkpoint has committed",
        ),
        ({"committed": False}, "holds rows, but the silver checkpoint has no batch"),
        ({"properties": {"delta.appendOnly": "false"}}, "that no Conflux flow wrote"),
        ({"properties": {**STAMPED, "conflux.flowId": "f2"}}, "not to this flow"),
        ({"properties": {**STAMPED, "conflux.generation": "3"}}, "an older checkpoint"),
    ],
)
def test_a_table_that_does_not_match_its_checkpoint_is_refused(kwargs: dict, expected: str) -> None:
    with pytest.raises(IdentityError, match=expected):
        check(**kwargs)


def test_rows_of_a_first_batch_that_never_committed_are_not_a_lost_checkpoint() -> None:
    """A kill after the first batch's writes, before its commit-log entry: the replay is skipped
    by its transaction id, so the flow must restart."""
    verdict = check_table(
        DESIGN, IDENTITY, STAMPED, SCHEMA, (), True, False, "flows/c.yaml", checkpoint_started=True
    )
    assert verdict == "ok"


def test_a_table_of_an_older_generation_is_stamped_after_a_reset() -> None:
    older = {**STAMPED, "conflux.generation": "1"}
    assert check(properties=older) == "stamp"
    assert check(properties=older, committed=False, has_data=False) == "stamp"


def silver_spec(name: str = "customers", current: str = "customers") -> dict:
    return {
        "name": name,
        "source": {"kind": "kafka", "topics": ["c"]},
        "target": {"table": f"bronze_{name}"},
        "silver": {
            "format": "debezium",
            "schema": "id BIGINT, name STRING",
            "current": {"table": current, "keys": ["id"]},
        },
    }


def test_two_flows_on_one_silver_table_are_refused(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path, jars_dir=tmp_path / "jars")
    first = parse_spec(silver_spec("a", current="shared"), where="flows/a.yaml")
    second = parse_spec(silver_spec("b", current="shared"), where="flows/b.yaml")
    with pytest.raises(SpecError, match=r"^flows/b.yaml: silver.current: flow b writes .*shared"):
        check_distinct_tables([first, second], settings)


def test_reset_silver_moves_tables_and_checkpoint_aside(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path, jars_dir=tmp_path / "jars")
    spec = parse_spec(silver_spec(), where="flows/customers.yaml")
    locations = FlowState.of(spec, settings)
    silver_dir = settings.lake.path / "silver"
    for folder in ("customers", "customers__deleted_keys", "silver_customers_events"):
        (silver_dir / folder / "_delta_log").mkdir(parents=True)
    (locations.stage_checkpoint("silver") / "commits").mkdir(parents=True)
    bronze = locations.table / "_delta_log"
    bronze.mkdir(parents=True)

    moved = dict(reset_stage(spec, settings))

    assert not (silver_dir / "customers").exists() and bronze.exists()
    assert not locations.stage_checkpoint("silver").exists()
    assert len(moved) == 4  # three tables (no quarantine yet) and the checkpoint
    assert all(Path(target).exists() for target in moved.values())


def test_reset_silver_refuses_while_the_flow_runs(tmp_path: Path) -> None:
    settings = Settings(runtime_dir=tmp_path, jars_dir=tmp_path / "jars")
    spec = parse_spec(silver_spec(), where="flows/customers.yaml")
    store = FileLeaseStore(FlowState.of(spec, settings).lease_dir.path)
    running = FlowLease("customers", store, "someone", {}, 30.0)
    running.acquire()
    try:
        with pytest.raises(LeaseHeldError):
            reset_stage(spec, settings)
    finally:
        running.release()

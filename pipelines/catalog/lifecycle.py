"""The life of a flow's tables after bronze: created from the spec, checked against it at every
start, reset, and (:mod:`pipelines.silver.refresh`) swapped.

A table is only correct for the spec that built it. Its table properties record the flow that owns
it (``conflux.flow`` / ``flowId`` / ``generation``, as for bronze) and the parts of the spec its
content depends on (``conflux.silver.*``, ``conflux.gold.design``). At start, :func:`check_table`
compares them and the table's schema and partitioning with the spec and refuses, naming the change
and the way forward, whenever continuing would mix two meanings in one table: other keys or another
sequence, a column removed or retyped, other partition columns, or a checkpoint that no longer
matches the table. A column added to the schema is added to the table.

The way forward is always a rebuild from the layer below, which keeps every record: ``conflux reset
FLOW --stage silver`` moves the silver and gold tables and checkpoints aside, and the next run reads
the whole bronze table again into new tables; ``--stage gold`` does the same for gold alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

from pipelines.catalog.roles import Layer
from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import CatalogTable, FlowCatalog
from pipelines.delta_writes import table_header
from pipelines.errors import ConfigError
from pipelines.identity import (
    FLOW_ID_PROPERTY,
    FLOW_PROPERTY,
    GENERATION_PROPERTY,
    FlowIdentity,
    IdentityError,
    checkpoint_has_offsets,
)
from pipelines.lease import FlowLease, new_owner_id, owner_details
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, join_readers


@dataclass(frozen=True)
class TableDesign:
    """What the spec says one silver table must be."""

    #: The catalog's record of the table.
    entry: CatalogTable
    #: Where this run writes it: the catalog's location, or a full refresh's twin beside it.
    path: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    #: Liquid clustering columns, set when the table is created.
    cluster_by: tuple[str, ...] = ()
    spec_properties: Mapping[str, str] = field(default_factory=dict)
    #: Delta properties the spec asks for, role defaults included (features: change data feed,
    #: deletion vectors, ...): set at creation.
    delta_properties: Mapping[str, str] = field(default_factory=dict)
    #: Those the spec states itself: also set on an existing table when they differ.
    stated_properties: Mapping[str, str] = field(default_factory=dict)
    #: The spec field a user edits to change this table, for messages.
    spec_field: str = "silver"
    #: How to rebuild the table, for messages (default: silver's refresh or reset).
    rebuild: str | None = None
    #: The stage whose checkpoint the table's writes follow, for messages.
    stage: str = "silver"


def ddl_struct(ddl: str) -> StructType:
    """A Spark DDL column list (``id BIGINT, name STRING``) as a StructType (needs a session)."""
    struct = StructType.fromDDL(ddl)
    assert isinstance(struct, StructType), ddl
    return struct


def _sql_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def sql_properties(properties: Mapping[str, str]) -> str:
    """``'k' = 'v', ...`` for ``SET TBLPROPERTIES``, quotes escaped (a sequence expression may
    hold a SQL string)."""
    return ", ".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in properties.items())


def _type_change(old: StructField, new: StructField) -> str | None:
    if old.dataType == new.dataType:
        return None
    return f"column {new.name} changed type from {old.dataType.simpleString()} to {new.dataType.simpleString()}"


def schema_changes(existing: StructType, wanted: StructType) -> tuple[list[str], list[StructField]]:
    """(incompatible changes, columns to add) from the table's schema to the spec's."""
    have = {f.name: f for f in existing.fields}
    want = {f.name: f for f in wanted.fields}
    problems = [f"column {name} was removed" for name in have if name not in want]
    problems += [
        p for name, f in want.items() if name in have for p in [_type_change(have[name], f)] if p
    ]
    added = [f for name, f in want.items() if name not in have]
    return problems, added


def check_table(
    design: TableDesign,
    identity: FlowIdentity,
    properties: Mapping[str, str] | None,
    schema: StructType | None,
    partition_columns: Sequence[str],
    has_data: bool,
    checkpoint_committed: bool,
    where: str,
    checkpoint_started: bool | None = None,
) -> str:
    """Whether to ``create`` the table, ``stamp`` it with this identity, or use it as it is (``ok``).

    ``checkpoint_committed``: the stage's checkpoint has committed batches; ``checkpoint_started``
    (default: the same): it planned any batch, committed or not. A table with rows beside a
    checkpoint that planned nothing means the checkpoint was lost; rows beside a planned but
    uncommitted first batch are that batch's, and its replay is skipped by its transaction id.

    Raises:
        IdentityError: the table cannot be continued under this spec and checkpoint.
    """
    rebuild = design.rebuild or (
        f"`conflux refresh {identity.flow}` (rebuilds the silver tables from bronze beside the "
        f"live ones, then swaps them in) or `conflux reset {identity.flow} --stage silver` "
        "(moves them aside; the next run rebuilds them)"
    )
    what = f"{where}: {design.spec_field}: the {design.entry.id} table {design.entry.name} at {design.path}"
    if properties is None:
        if checkpoint_committed:
            raise IdentityError(
                f"{what} is missing, but the {design.stage} checkpoint has committed batches, so those "
                f"events would never be written again. Restore the table, or run {rebuild}."
            )
        return "create"
    if properties.get(FLOW_ID_PROPERTY) is None:
        raise IdentityError(
            f"{what} already holds a Delta table that no Conflux flow wrote. Point "
            f"{design.spec_field} at another table, or move that table away."
        )
    if properties[FLOW_ID_PROPERTY] != identity.flow_id:
        raise IdentityError(
            f"{what} belongs to flow {properties.get(FLOW_PROPERTY)} (flow id "
            f"{properties[FLOW_ID_PROPERTY]}), not to this flow: give it another table name."
        )
    changes = [
        f"{label} changed from {properties.get(key)!r} to {value!r}"
        for key, value in design.spec_properties.items()
        for label in [key.rsplit(".", 1)[-1]]
        if properties.get(key) is not None and properties.get(key) != value
    ]
    assert schema is not None
    problems, _ = schema_changes(schema, design.schema)
    changes += problems
    if tuple(partition_columns) != tuple(design.partition_by):
        changes.append(
            f"partitioning changed from {list(partition_columns)} to {list(design.partition_by)}"
        )
    if changes:
        raise IdentityError(
            f"{what} was built under another spec: {'; '.join(changes)}. Its rows would mean "
            f"something else under the new spec. Change the spec back, or run {rebuild}."
        )
    table_generation = int(properties.get(GENERATION_PROPERTY, "0"))
    if table_generation > identity.generation:
        raise IdentityError(
            f"{what} was written by generation {table_generation} of this flow, but the "
            f"checkpoint is generation {identity.generation}: an older checkpoint was restored. "
            f"Restore the matching one, or run {rebuild}."
        )
    if table_generation < identity.generation:
        return "stamp"  # after `conflux reset`: a new app id, so nothing is skipped or doubled
    started = checkpoint_committed if checkpoint_started is None else checkpoint_started
    if not started and has_data:
        raise IdentityError(
            f"{what} holds rows, but the {design.stage} checkpoint has no batch: starting again would "
            f"read its input from the start and write those rows twice. Restore the checkpoint, or "
            f"run {rebuild}."
        )
    return "ok"


def ensure_table(
    spark: SparkSession,
    design: TableDesign,
    identity: FlowIdentity,
    checkpoint_committed: bool,
    where: str,
    checkpoint_started: bool | None = None,
) -> None:
    """Create, stamp or evolve one silver table so that it matches ``design`` (see :func:`check_table`)."""
    existing = table_header(spark, design.path)
    properties = schema = None
    partitions: list[str] = []
    has_data = False
    if existing is not None:
        properties = existing.properties
        partitions = existing.partition_columns
        has_data = existing.has_data
        schema = spark.read.format("delta").load(design.path).schema
    action = check_table(
        design,
        identity,
        properties,
        schema,
        partitions,
        has_data,
        checkpoint_committed,
        where,
        checkpoint_started,
    )
    stamp = {**identity.table_properties(), **design.spec_properties}
    if action == "create":
        builder = (
            DeltaTable.createIfNotExists(spark).location(design.path).addColumns(design.schema)
        )
        if design.partition_by:
            builder = builder.partitionedBy(*design.partition_by)
        if design.cluster_by:
            builder = builder.clusterBy(*design.cluster_by)
        for key, value in {**design.delta_properties, **stamp}.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    assert schema is not None
    _, added = schema_changes(schema, design.schema)
    if added:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.`{design.path}` ADD COLUMNS ({columns})")
    _apply_features(spark, design, properties or {}, where)
    missing = {k: v for k, v in stamp.items() if (properties or {}).get(k) != v}
    if action == "stamp" or missing:
        assignments = sql_properties(missing)
        if assignments:
            spark.sql(f"ALTER TABLE delta.`{design.path}` SET TBLPROPERTIES ({assignments})")


def _apply_features(
    spark: SparkSession, design: TableDesign, properties: Mapping[str, str], where: str
) -> None:
    """Set the Delta properties the spec states that the table does not have yet (an absent
    boolean feature is off). Delta refuses what it cannot do, e.g. turning column mapping off."""
    changed = {
        key: value
        for key, value in design.stated_properties.items()
        if properties.get(key, "false" if value == "false" else None) != value
    }
    if not changed:
        return
    assignments = sql_properties(changed)
    try:
        spark.sql(f"ALTER TABLE delta.`{design.path}` SET TBLPROPERTIES ({assignments})")
    except Exception as exc:
        raise ConfigError(
            f"{where}: {design.spec_field}: Delta refused to change the {design.entry.id} table "
            f"{design.entry.name} to {assignments}: {str(exc).splitlines()[0]}. Change the spec back, "
            f"or rebuild the silver tables with `conflux reset FLOW --stage silver`."
        ) from exc


def require_own_silver_query(spec: FlowSpec, action: str) -> None:
    """A silver stage can only start over from bronze with a checkpoint of its own.

    Raises:
        ConfigError: the flow has no silver stage, or it runs inside bronze's batches.
    """
    where = f"{spec.spec_file}: flow {spec.name}"
    if spec.silver is None:
        raise ConfigError(f"{where} has no silver stage to {action}")
    if not spec.silver.own_query:
        raise ConfigError(
            f"{where}: silver.chaining: a silver stage written inside bronze's batches has no "
            f"checkpoint of its own to start over from: set chaining: stream to {action} it, or "
            f"reset the whole flow with `conflux reset {spec.name}`"
        )


#: The stages a reset can start over: silver (and gold, which reads it), or gold alone.
ResetStage = Literal["silver", "gold"]


def reset_stage(
    spec: FlowSpec, settings: Settings, stage: ResetStage = "silver"
) -> list[tuple[str, str]]:
    """Start the silver stage (and gold, which reads it) or only gold over: move their
    checkpoints and tables aside.

    The next run reads the whole bronze table again into new silver tables (Delta's transaction
    ids live in each table's log, so new tables need no new app id), and gold reads the whole
    events table again. Nothing is deleted: checkpoints go to the flow's ``_archive/`` and each
    table to ``<path>.archived-<time>``. Returns (what, where it went) for each thing moved.

    Raises:
        LeaseHeldError: the flow is running; the reset holds the flow's lease while it moves.
        ConfigError: the flow has no such stage, or silver runs inside bronze's batches.
    """
    if stage == "silver":
        require_own_silver_query(spec, "reset")
        refuse_started_readers(spec, settings, "reset")
    elif not spec.gold:
        raise ConfigError(f"{spec.spec_file}: flow {spec.name} has no gold stage to reset")
    catalog = FlowCatalog.of(spec, settings)
    state = catalog.state
    lease = FlowLease(spec.name, state.lease_store(), new_owner_id("reset"), owner_details())
    lease.acquire()
    try:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        moved: list[tuple[str, str]] = []
        checkpoints = (
            [state.silver_checkpoint, state.gold_dir] if stage == "silver" else [state.gold_dir]
        )
        for checkpoint in checkpoints:
            if checkpoint.exists():
                target = state.archive_dir / f"{checkpoint.name}-{stamp}"
                checkpoint.move_to(target)
                moved.append((str(checkpoint), str(target)))
        layers = (Layer.SILVER, Layer.GOLD) if stage == "silver" else (Layer.GOLD,)
        tables = catalog.layer_tables(*layers)  # declared ones first, as earlier versions moved
        for table in sorted(tables, key=lambda t: t.is_side_table):
            if table.path.exists():
                target = table.path.with_suffix_appended(f".archived-{stamp}")
                table.path.move_to(target)
                moved.append((str(table.path), str(target)))
        return moved
    finally:
        lease.release()


def refuse_started_readers(spec: FlowSpec, settings: Settings, action: str) -> None:
    """Refuse ``action`` on ``spec``'s silver events (a reset or full refresh replaces them) while
    another flow's gold join has streamed from them: its stream could not continue on the new
    table. Its gold is reset first; its next run reads the new events from the start.

    Raises:
        ConfigError: naming the joins and the command that resets them.
    """
    started = [
        (reader, gold)
        for reader, gold in join_readers(spec)
        if checkpoint_has_offsets(FlowState.of(reader, settings).gold_checkpoint(gold.table, True))
    ]
    if started:
        names = ", ".join(f"{reader.name}'s {gold.table}" for reader, gold in started)
        commands = " and ".join(
            f"`conflux reset {name} --stage gold`"
            for name in dict.fromkeys(r.name for r, _ in started)
        )
        raise ConfigError(
            f"{spec.spec_file}: the gold joins {names} stream from flow {spec.name}'s silver "
            f"events, which a {action} replaces: their streams could not go on. Reset them "
            f"first ({commands}; their next runs join the new events from the start), then "
            f"run the {action} again"
        )

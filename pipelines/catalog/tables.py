"""Every table a flow owns, as one typed record each: built once from the spec and the settings.

:class:`FlowCatalog` is the only place that derives a table's location, its role, the stage that
writes it, its side tables, its Dagster asset key and its Delta transaction app id. The spec names
the tables a user declares (:meth:`FlowSpec.tables`); the catalog adds the side tables Conflux
keeps beside them:

- ``<current>__deleted_keys`` beside the current-state table (keys deleted, with their sequence);
- ``<gold>__input`` beside each gold table (the on-time rows its stateful query reads);
- ``<gold>__backfills`` beside each gold table (the late rows each backfill covered).

Order is stable (bronze, silver's, then each gold table's): maintenance, the asset graph and the
messages list tables in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.catalog.roles import (
    BRONZE_STAGE,
    SILVER_STAGE,
    Layer,
    TableRole,
    gold_stage,
    parse_role_id,
    role_id,
)
from pipelines.catalog.state import FlowState, resolve
from pipelines.errors import ConfigError
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import FileSource, FlowSpec, SpecError

if TYPE_CHECKING:
    from pipelines.identity import FlowIdentity

#: Suffix of a table rebuilt beside the live one.
REBUILT_SUFFIX = "__refresh"
#: The event date column that partitions the events, gold and late tables.
EVENT_DATE = "_event_date"
#: Suffix of each side table's name and location, by role (after its main table's).
SIDE_SUFFIX = {
    TableRole.DELETED_KEYS: "__deleted_keys",
    TableRole.GOLD_INPUT: "__input",
    TableRole.BACKFILLS: "__backfills",
}
#: The main table each side table sits beside.
_SIDE_OF = {
    TableRole.DELETED_KEYS: TableRole.CURRENT,
    TableRole.GOLD_INPUT: TableRole.GOLD,
    TableRole.BACKFILLS: TableRole.GOLD,
}


@dataclass(frozen=True)
class CatalogTable:
    """One Delta table of a flow."""

    role: TableRole
    #: The table's name (the last part of its asset key; side tables: the main name + suffix).
    name: str
    path: Location
    #: The spec section a user edits about this table, for messages (``target``,
    #: ``silver.events``, ..., ``gold``).
    spec_field: str
    #: The stage that writes it in a flow's run (None: written outside any stream, by
    #: backfills). Its writes carry the batch ids of that stage's query, or of bronze's when the
    #: stage is fused into bronze's batch (:meth:`FlowCatalog.query_checkpoints`).
    writer: str | None
    #: The gold table a per-gold-table role belongs to.
    gold: str | None = None
    #: Columns the spec asks OPTIMIZE to Z-order by.
    z_order_by: tuple[str, ...] = ()
    #: The table's partition columns (what a rewrite of the whole table must keep).
    partition_by: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """The table's id in messages and status files (:func:`pipelines.catalog.roles.role_id`)."""
        return role_id(self.role, self.gold)

    @property
    def layer(self) -> Layer:
        return self.role.layer

    @property
    def is_side_table(self) -> bool:
        """Kept by Conflux beside a declared table; no asset of its own."""
        return self.role in SIDE_SUFFIX

    @property
    def asset_key_path(self) -> tuple[str, str] | None:
        """The Dagster asset key's parts (``bronze/<table>``, ``silver/<table>``, ...); None for a
        side table."""
        prefix = self.role.asset_prefix
        return None if prefix is None else (prefix, self.name)

    @property
    def location(self) -> str:
        """The location Spark and Delta are given."""
        return str(self.path)

    @property
    def rebuilt_location(self) -> str:
        """Where a full refresh rebuilds the table beside the live one, before swapping it in
        (:mod:`pipelines.silver.refresh`)."""
        return str(self.rebuilt_path)

    @property
    def rebuilt_path(self) -> Location:
        """:attr:`rebuilt_location` as a location."""
        return self.path.with_suffix_appended(REBUILT_SUFFIX)

    def app_id(self, identity: FlowIdentity, silver_generation: int | None = None) -> str:
        """The Delta transaction app id of this table's writes.

        Bronze writes under the flow's app id (flow id and checkpoint generation); a silver
        table under its own, which a full refresh (``silver_generation``) renews; a gold table
        under the flow's app id and its name.
        """
        if self.role is TableRole.BRONZE:
            return identity.txn_app_id
        if self.layer is Layer.SILVER:
            return identity.silver_app_id(self.name, silver_generation)
        return f"{identity.txn_app_id}-{self.name}"


@dataclass(frozen=True)
class FlowCatalog:
    """The tables and the state of one flow (see the module doc)."""

    spec: FlowSpec
    state: FlowState
    tables: tuple[CatalogTable, ...]

    @classmethod
    def of(cls, spec: FlowSpec, settings: Settings) -> FlowCatalog:
        state = FlowState.of(spec, settings)
        return cls(spec, state, tuple(_tables(spec, settings, state)))

    def __iter__(self) -> Iterator[CatalogTable]:
        return iter(self.tables)

    def find(self, role: TableRole, gold: str | None = None) -> CatalogTable | None:
        """The flow's table of ``role`` (of gold table ``gold`` for a per-gold-table role)."""
        wanted = role_id(role, gold)
        return next((t for t in self.tables if t.id == wanted), None)

    def table(self, role: TableRole, gold: str | None = None) -> CatalogTable:
        """Like :meth:`find`, for a table the spec validated to exist.

        Raises:
            KeyError: the flow has no such table.
        """
        found = self.find(role, gold)
        if found is None:
            raise KeyError(f"flow {self.spec.name} has no {role_id(role, gold)} table")
        return found

    def by_id(self, table_id: str) -> CatalogTable:
        """The table of an id read from a message or a status file."""
        role, gold = parse_role_id(table_id)
        return self.table(role, gold)

    @property
    def declared(self) -> list[CatalogTable]:
        """The tables the spec declares (each a Dagster asset), without the side tables."""
        return [t for t in self.tables if not t.is_side_table]

    def written_by(self, stage: str) -> list[CatalogTable]:
        """The tables whose writes carry the batch ids of ``stage``."""
        return [t for t in self.tables if t.writer == stage]

    def query_checkpoints(self) -> dict[str, Location]:
        """The Spark checkpoint of each stage that runs a query of its own, in flow order
        (silver's only with ``chaining: stream``; fused into bronze it has none)."""
        silver = self.spec.silver
        stages = [BRONZE_STAGE] + (
            [SILVER_STAGE] if silver is not None and silver.own_query else []
        )
        for gold in self.spec.gold:  # the split runs before the stateful query that reads it
            stages += [gold_stage(gold.table, split=True), gold_stage(gold.table)]
        return {stage: self.state.stage_checkpoint(stage) for stage in stages}

    def side_tables(self, table: CatalogTable) -> list[CatalogTable]:
        """The tables Conflux keeps beside ``table`` (its deleted keys; a gold table's input
        and backfill record)."""
        return [
            t
            for t in self.tables
            if t.is_side_table and _SIDE_OF[t.role] is table.role and t.gold == table.gold
        ]

    def of_gold(self, gold: str) -> list[CatalogTable]:
        """A gold table and everything Conflux keeps for it (input, late rows, backfills)."""
        return [t for t in self.tables if t.gold == gold]

    def layer_tables(self, *layers: Layer) -> list[CatalogTable]:
        return [t for t in self.tables if t.layer in layers]

    def gold_quarantine_app_id(self, identity: FlowIdentity, gold: str, epoch: str) -> str:
        """The app id of a gold split's appends to the flow's quarantine: the split's own
        checkpoint epoch keeps a gold reset (batch ids restart) from being skipped as a replay."""
        quarantine = self.table(TableRole.QUARANTINE)
        return f"{identity.txn_app_id}-{quarantine.name}-gold-{gold}-{epoch}"


def _tables(spec: FlowSpec, settings: Settings, state: FlowState) -> Iterator[CatalogTable]:
    """The declared tables in the spec's order, each followed by its side tables."""
    for declared in spec.tables():
        role, gold, name = declared.role, declared.gold, declared.name
        path, z_order, partition_by = _placed(spec, settings, state, role, gold)
        main = CatalogTable(
            role, name, path, _section(role), _writer(role, gold), gold, z_order, partition_by
        )
        yield main
        for side, of in _SIDE_OF.items():
            if of is role:
                suffix = SIDE_SUFFIX[side]
                yield CatalogTable(
                    side,
                    f"{name}{suffix}",
                    path.with_suffix_appended(suffix),
                    main.spec_field,
                    None if side is TableRole.BACKFILLS else _writer(side, gold),
                    gold,
                )


def _placed(
    spec: FlowSpec, settings: Settings, state: FlowState, role: TableRole, gold: str | None
) -> tuple[Location, tuple[str, ...], tuple[str, ...]]:
    """Where a declared table lives (its spec ``path``, or ``<lake>/<layer>/<table>``), the
    columns its spec section Z-orders by, and its partition columns."""
    if role is TableRole.BRONZE:
        return state.table, (), tuple(spec.target.partition_by)
    if gold is not None:  # gold and late tables are partitioned by event date, for backfills
        section = next(g for g in spec.gold if g.table == gold)
        if role is TableRole.LATE:
            late = section.late
            return _default(settings, Layer.GOLD, late.table, late.path), (), (EVENT_DATE,)
        path = _default(settings, Layer.GOLD, section.table, section.path)
        return path, section.z_order_by, (EVENT_DATE,)
    assert spec.silver is not None
    table = getattr(spec.silver, role.value)
    path = _default(settings, Layer.SILVER, table.table, table.path)
    if role is TableRole.EVENTS:
        return path, table.z_order_by, (EVENT_DATE,)
    if role is TableRole.CURRENT:
        return path, table.z_order_by, tuple(table.partition_by)
    return path, table.z_order_by, ()


def _default(settings: Settings, layer: Layer, table: str, path: str | None) -> Location:
    return resolve(settings, path) if path else settings.lake / layer.value / table


def _section(role: TableRole) -> str:
    if role is TableRole.BRONZE:
        return "target"
    return "gold" if role.per_gold_table else f"silver.{role.value}"


def _writer(role: TableRole, gold: str | None) -> str:
    if role is TableRole.BRONZE:
        return BRONZE_STAGE
    if gold is None:
        return SILVER_STAGE
    return gold_stage(gold, split=role is not TableRole.GOLD)


def declared_paths(spec: FlowSpec, settings: Settings) -> dict[str, Location]:
    """The location of each table the spec declares, by table id."""
    return {table.id: table.path for table in FlowCatalog.of(spec, settings).declared}


def check_distinct_tables(specs: Iterable[FlowSpec], settings: Settings) -> None:
    """Two specs (or two roles of one) writing one table location would corrupt it: refuse."""
    seen: dict[str, tuple[FlowSpec, CatalogTable]] = {}
    for spec in specs:
        for table in FlowCatalog.of(spec, settings).declared:
            where = str(table.path.path.resolve()) if table.path.is_local else table.path.uri
            other = seen.get(where)
            if other is not None:
                other_spec, other_table = other
                field = table.role.name_field if table.layer is Layer.GOLD else table.spec_field
                raise SpecError(
                    f"{spec.spec_file}: {field}: flow {spec.name} writes {where} as its "
                    f"{table.id} table, which flow {other_spec.name} ({other_spec.spec_file}) "
                    f"writes as its {other_table.id} table; give each table its own location"
                )
            seen[where] = (spec, table)


def check_locations(specs: Iterable[FlowSpec], settings: Settings) -> None:
    """Refuse, before Spark starts, locations the flows cannot use: two tables at one location
    (:func:`check_distinct_tables`), and on a cluster anything on the driver's local disk."""
    specs = list(specs)
    check_distinct_tables(specs, settings)
    if settings.on_cluster:
        for spec in specs:
            check_reachable_from_executors(spec, settings)


def check_reachable_from_executors(spec: FlowSpec, settings: Settings) -> None:
    """On a cluster, executors on other hosts write the tables, the state stores and read the
    source: every one must be on shared storage (an ``s3a://`` location), never a local path.

    Raises:
        ConfigError: the checkpoints root is a local path (a setting).
        SpecError: a table or the source is on the driver's disk, naming the spec field and fix.
    """
    on = f"Spark runs on a cluster ({settings.spark_master}), whose executors cannot reach this "
    on += "machine's disk"
    if settings.checkpoints.is_local:
        raise ConfigError(
            f"checkpoints_root: {settings.checkpoints.uri} is a local path, but {on}: set "
            "CONFLUX_CHECKPOINTS_ROOT (or checkpoints_root in conflux.yaml) to an s3a:// prefix, "
            "or use the cluster profile (CONFLUX_PROFILE=cluster)"
        )
    if isinstance(spec.source, FileSource):
        raise SpecError(
            f"{spec.spec_file}: source.path: {spec.source.path} is a local landing folder, but "
            f"{on}: file sources run on a local master only (CONFLUX_SPARK_MASTER=local[*])"
        )
    for table in FlowCatalog.of(spec, settings).declared:
        if table.path.is_local:
            named = table.role.name_field  # e.g. gold.late.table: its path is gold.late.path
            field = "target.path" if table.role is TableRole.BRONZE else named[:-5] + "path"
            where = f" (gold table {table.gold})" if table.gold else ""
            raise SpecError(
                f"{spec.spec_file}: {field}{where}: the {table.id} table's location "
                f"{table.path.uri} is a local path, but {on}: give it an s3a:// path there, or "
                "set the lake root (CONFLUX_LAKE_ROOT / lake_root) to an s3a:// prefix for the "
                "tables without one"
            )

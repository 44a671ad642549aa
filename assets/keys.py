"""Asset keys of Conflux tables, in one place so the graph and the launcher agree.

Each table a flow declares is an asset; its key is the catalog's
(:attr:`pipelines.catalog.tables.CatalogTable.asset_key_path`): ``bronze/<target table>``,
``silver/<events, current or history table>``, ``quarantine/<table>``, ``gold/<table>``,
``late/<late table>``. Maps here are keyed by the table's id in messages
(:func:`pipelines.catalog.roles.role_id`).
"""

from dagster import AssetKey

from pipelines.catalog.roles import TableRole, role_id
from pipelines.spec import AnyGold, FlowSpec, GoldJoinSpec, join_input


def bronze_key(spec: FlowSpec) -> AssetKey:
    """``bronze/<table>``: the asset key of a flow's bronze table."""
    return key_of(spec, TableRole.BRONZE)


def _optional_key(spec: FlowSpec, role: TableRole) -> AssetKey | None:
    return flow_table_keys(spec).get(role_id(role))


def events_key(spec: FlowSpec) -> AssetKey | None:
    """``silver/<events table>``: the flow's parsed, append-only events (None without silver)."""
    return _optional_key(spec, TableRole.EVENTS)


def current_key(spec: FlowSpec) -> AssetKey | None:
    """``silver/<current table>``: the flow's current state per key (None if it keeps none)."""
    return _optional_key(spec, TableRole.CURRENT)


def quarantine_key(spec: FlowSpec) -> AssetKey | None:
    """``quarantine/<table>``: the records silver could not parse (None without silver)."""
    return _optional_key(spec, TableRole.QUARANTINE)


def table_key(role: TableRole, name: str) -> AssetKey:
    """The asset key of a declared table of ``role`` named ``name``."""
    prefix = role.asset_prefix
    assert prefix is not None, f"a {role} table is a side table, not an asset"
    return AssetKey([prefix, name])


def flow_table_keys(spec: FlowSpec) -> dict[str, AssetKey]:
    """The asset key of each of the flow's declared tables, by table id (bronze first, then
    silver's, then each gold table's)."""
    keys = {}
    for declared in spec.tables():
        keys[declared.id] = table_key(declared.role, declared.name)
    return keys


def key_of(spec: FlowSpec, role: TableRole, gold: str | None = None) -> AssetKey:
    """The asset key of the flow's table of ``role`` (of gold table ``gold``)."""
    return flow_table_keys(spec)[role_id(role, gold)]


def flow_asset_keys(spec: FlowSpec) -> list[AssetKey]:
    """Every asset key of the flow's tables: what one run of the flow materializes."""
    return list(flow_table_keys(spec).values())


def table_names(spec: FlowSpec) -> dict[str, str]:
    """The table name of each of the flow's tables, by role (the keys' last part)."""
    return {role: key.path[-1] for role, key in flow_table_keys(spec).items()}


def gold_input_keys(spec: FlowSpec, gold: AnyGold) -> list[AssetKey]:
    """The silver events a gold table reads: the flow's, and a join's other flow's."""
    keys = [key_of(spec, TableRole.EVENTS)]
    if isinstance(gold, GoldJoinSpec):
        other = join_input(spec, gold)
        if other.name != spec.name:
            keys.append(key_of(other, TableRole.EVENTS))
    return keys

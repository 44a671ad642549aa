"""Asset keys of Conflux tables, in one place so the graph and the launcher agree.

A flow's tables, by role: ``bronze`` (``bronze/<target table>``), and with a ``silver:`` section
``events`` (``silver/<events table>``), ``quarantine`` (``quarantine/<quarantine table>``) and,
if the spec has one, ``current`` (``silver/<current table>``); per gold table ``gold/<table>``
(``gold/<table>``) and ``late/<table>`` (``late/<late table>``).
"""

from dagster import AssetKey

from pipelines.spec import AnyGold, FlowSpec, GoldJoinSpec, join_input, role_kind


def bronze_key(spec: FlowSpec) -> AssetKey:
    """``bronze/<table>``: the asset key of a flow's bronze table."""
    return AssetKey(["bronze", spec.target.table])


def events_key(spec: FlowSpec) -> AssetKey | None:
    """``silver/<events table>``: the flow's parsed, append-only events (None without silver)."""
    silver = spec.silver
    return None if silver is None else AssetKey(["silver", silver.events.table])


def current_key(spec: FlowSpec) -> AssetKey | None:
    """``silver/<current table>``: the flow's current state per key (None if it keeps none)."""
    silver = spec.silver
    if silver is None or silver.current is None:
        return None
    return AssetKey(["silver", silver.current.table])


def quarantine_key(spec: FlowSpec) -> AssetKey | None:
    """``quarantine/<table>``: the records silver could not parse (None without silver)."""
    silver = spec.silver
    return None if silver is None else AssetKey(["quarantine", silver.quarantine.table])


#: The first part of the asset key of a table, by its role in the flow.
KEY_PREFIX = {
    "bronze": "bronze",
    "events": "silver",
    "current": "silver",
    "history": "silver",
    "quarantine": "quarantine",
    "gold": "gold",
    "late": "late",
}


def flow_table_keys(spec: FlowSpec) -> dict[str, AssetKey]:
    """The asset key of each of the flow's tables, by role (bronze first, then silver's)."""
    return {role: AssetKey([KEY_PREFIX[role_kind(role)], table]) for role, table in spec.tables()}


def flow_asset_keys(spec: FlowSpec) -> list[AssetKey]:
    """Every asset key of the flow's tables: what one run of the flow materializes."""
    return list(flow_table_keys(spec).values())


def table_names(spec: FlowSpec) -> dict[str, str]:
    """The table name of each of the flow's tables, by role (the keys' last part)."""
    return {role: key.path[-1] for role, key in flow_table_keys(spec).items()}


def gold_input_keys(spec: FlowSpec, gold: AnyGold) -> list[AssetKey]:
    """The silver events a gold table reads: the flow's, and a join's other flow's."""
    keys = [flow_table_keys(spec)["events"]]
    if isinstance(gold, GoldJoinSpec):
        other = join_input(spec, gold)
        if other.name != spec.name:
            keys.append(flow_table_keys(other)["events"])
    return keys

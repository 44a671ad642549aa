"""Column lineage of a flow's tables, derived from its spec (``dagster/column_lineage``).

Only what the spec makes certain: silver events parse bronze's ``value`` bytes (and carry its
topic, partition and offset); current state and history copy the events' columns; a gold
aggregate groups by events' columns and aggregates one of them, its window from the event
time; a join keeps columns of both flows' events. A flow with a ``transform`` may rename or
derive any column, so its silver and gold tables get no lineage rather than a wrong one.
"""

from __future__ import annotations

from dagster import AssetKey, TableColumnDep, TableColumnLineage

from assets.keys import key_of
from pipelines.catalog.roles import TableRole
from pipelines.spec import (
    AnyGold,
    FlowSpec,
    GoldJoinSpec,
    GoldSpec,
    join_input,
)

#: Bronze columns that silver's metadata columns copy.
BRONZE_METADATA = {"_source_topic": "topic", "_source_partition": "partition",
                   "_source_offset": "offset"}  # fmt: skip


def _deps(**columns: list[tuple[AssetKey, str]]) -> TableColumnLineage:
    return TableColumnLineage(
        deps_by_column={
            name: [TableColumnDep(asset_key=key, column_name=col) for key, col in deps]
            for name, deps in columns.items()
            if deps
        }
    )


def _gold_lineage(spec: FlowSpec, gold: AnyGold) -> TableColumnLineage:
    events = key_of(spec, TableRole.EVENTS)
    if isinstance(gold, GoldSpec):
        columns = {c: [(events, c)] for c in gold.group_by}
        columns["window_start"] = columns["window_end"] = [(events, gold.event_time)]
        for aggregate in gold.aggregates:
            if aggregate.column:
                columns[aggregate.name] = [(events, aggregate.column)]
        return _deps(**columns)
    assert isinstance(gold, GoldJoinSpec)
    join = gold.join
    other = key_of(join_input(spec, gold), TableRole.EVENTS)
    columns = {key: [(events, key), (other, key)] for key in join.keys}
    for name, column in zip(join.left.output_names(), join.left.columns, strict=True):
        columns.setdefault(name, [(events, column)])
    for name, column in zip(join.right.output_names(), join.right.columns, strict=True):
        columns.setdefault(name, [(other, column)])
    columns["_left_time"] = [(events, join.left.event_time)]
    columns["_right_time"] = [(other, join.right.event_time)]
    return _deps(**columns)


def column_lineage(spec: FlowSpec) -> dict[AssetKey, TableColumnLineage]:
    """The lineage of each of the flow's tables the spec makes certain, by asset key."""
    silver = spec.silver
    if silver is None or silver.transform is not None:
        return {}
    bronze, events = key_of(spec, TableRole.BRONZE), key_of(spec, TableRole.EVENTS)
    parsed = silver.columns()
    lineage = {
        events: _deps(
            **{c: [(bronze, "value")] for c in parsed},
            **{c: [(bronze, b)] for c, b in BRONZE_METADATA.items()},
        )
    }
    if silver.current is not None:
        kept = silver.current.kept_columns(parsed)
        lineage[key_of(spec, TableRole.CURRENT)] = _deps(**{c: [(events, c)] for c in kept})
    if silver.history is not None:
        lineage[key_of(spec, TableRole.HISTORY)] = _deps(**{c: [(events, c)] for c in parsed})
    for gold in spec.gold:
        lineage[key_of(spec, TableRole.GOLD, gold.table)] = _gold_lineage(spec, gold)
    return lineage

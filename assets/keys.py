"""Asset keys of Conflux tables, in one place so the graph and the launcher agree."""

from dagster import AssetKey

from pipelines.spec import FlowSpec


def bronze_key(spec: FlowSpec) -> AssetKey:
    """``bronze/<table>``: the asset key of a flow's bronze table."""
    return AssetKey(["bronze", spec.target.table])

"""Flow specs become assets: each source is an external asset upstream of its bronze table.

All bronze tables live in one subsettable multi-asset, so materializing several of them in one run
launches ONE Spark application that runs those flows side by side (many tables do not need many
applications); materializing one table runs just its flow.
"""

from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Config,
    Failure,
    PipesExecutionResult,
    multi_asset,
)
from pydantic import Field

from assets.keys import bronze_key
from assets.launch import run_flows
from assets.resources import SparkSubmitResource
from pipelines.locations import FlowLocations
from pipelines.settings import Settings
from pipelines.spec import TRIGGER_MODES, FileSource, FlowSpec, KafkaSource


class FlowRunConfig(Config):
    trigger: str | None = Field(
        default=None,
        description=f"Override the specs' trigger mode for this run ({', '.join(TRIGGER_MODES)}).",
    )


def source_specs(spec: FlowSpec) -> list[AssetSpec]:
    """External assets for the flow's source: one per Kafka topic, or the landing folder."""
    source = spec.source
    if isinstance(source, FileSource):
        return [
            AssetSpec(
                key=AssetKey(["landing", spec.name]),
                description=f"{source.format} files landing in {source.path}",
                group_name="sources",
                kinds={"file"},
            )
        ]
    assert isinstance(source, KafkaSource)
    if source.pattern:
        named = {f"pattern_{spec.name}": f"Kafka topics matching {source.pattern}"}
    else:
        named = {topic: f"Kafka topic {topic}" for topic in source.topics}
    return [
        AssetSpec(key=AssetKey(["kafka", n]), description=d, group_name="sources", kinds={"kafka"})
        for n, d in named.items()
    ]


def bronze_spec(spec: FlowSpec, settings: Settings) -> AssetSpec:
    locations = FlowLocations.of(spec, settings)
    return AssetSpec(
        key=bronze_key(spec),
        deps=[s.key for s in source_specs(spec)],
        group_name="bronze",
        kinds={"spark", "delta"},
        description=spec.description or f"Bronze table of flow {spec.name} (raw, exactly once).",
        metadata={
            "table_path": str(locations.table),
            "checkpoint": str(locations.checkpoint),
            "spec_file": spec.spec_file,
            "flow": spec.name,
            "trigger": spec.trigger.mode,
        },
        tags={"conflux/trigger": spec.trigger.mode},
        skippable=True,
    )


def bronze_assets(specs: list[FlowSpec], settings: Settings) -> AssetsDefinition:
    """One subsettable multi-asset over every flow's bronze table."""
    by_key = {bronze_key(spec): spec for spec in specs}

    @multi_asset(
        name="bronze_flows",
        specs=[bronze_spec(spec, settings) for spec in specs],
        can_subset=True,
    )
    def _bronze_flows(
        context: AssetExecutionContext, config: FlowRunConfig, spark_submit: SparkSubmitResource
    ) -> Iterator[PipesExecutionResult]:
        if config.trigger is not None and config.trigger not in TRIGGER_MODES:
            raise Failure(f"trigger: {config.trigger!r} is not one of {', '.join(TRIGGER_MODES)}")
        selected = [by_key[key] for key in sorted(context.selected_asset_keys, key=str)]
        yield from run_flows(context, selected, spark_submit, config.trigger)

    return _bronze_flows

"""Flow specs become assets: each source is an external asset upstream of its bronze table.

Each flow is one multi-asset (its tables; the stages after bronze join it), run as ONE Spark
application, in its own concurrency pool ``conflux/flow/<name>`` (limit 1, checked per run: see
``platform/dagster/dagster.yaml``), so Dagster queues a second run of a flow before any process
starts. The flow's lease (:mod:`pipelines.lease`) is the guard that holds everywhere else: a
launch from the CLI, another Dagster instance, an in-process ``materialize``.
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


def flow_pool(spec: FlowSpec) -> str:
    """The Dagster concurrency pool of a flow's runs (one slot: one run at a time)."""
    return f"conflux/flow/{spec.name}"


def flow_assets(spec: FlowSpec, settings: Settings) -> AssetsDefinition:
    """The multi-asset of one flow: launching it runs the flow's Spark application."""

    @multi_asset(
        name=f"flow_{spec.name}",
        specs=[bronze_spec(spec, settings)],
        pool=flow_pool(spec),
        description=f"Flow {spec.name} ({spec.spec_file}).",
    )
    def _flow(
        context: AssetExecutionContext, config: FlowRunConfig, spark_submit: SparkSubmitResource
    ) -> Iterator[PipesExecutionResult]:
        if config.trigger is not None and config.trigger not in TRIGGER_MODES:
            raise Failure(f"trigger: {config.trigger!r} is not one of {', '.join(TRIGGER_MODES)}")
        yield from run_flows(context, [spec], spark_submit, config.trigger)

    return _flow

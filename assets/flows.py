"""Flow specs become assets: each source is an external asset upstream of its bronze table.

Each flow is one multi-asset of its tables (bronze; with a ``silver:`` section also the silver
events, the quarantine and, if declared, the current-state table: bronze -> events -> current,
bronze -> quarantine), run as ONE Spark application: a run always runs the whole flow, so the
multi-asset cannot be subset, and a job selects all of a flow's assets. Each flow runs in its
own concurrency pool ``conflux/flow/<name>`` (limit 1, checked per run: see
``platform/dagster/dagster.yaml``), so Dagster queues a second run of a flow before any process
starts. The flow's lease (:mod:`pipelines.lease`) is the guard that holds everywhere else: a
launch from the CLI, another Dagster instance, an in-process ``materialize``.
"""

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Backoff,
    Config,
    Failure,
    PipesExecutionResult,
    RetryPolicy,
    multi_asset,
)
from pydantic import Field

from assets.keys import bronze_key, events_key, gold_input_keys, key_of
from assets.launch import run_flows
from assets.resources import SparkSubmitResource
from pipelines.catalog.roles import TableRole
from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import FlowCatalog
from pipelines.settings import Settings
from pipelines.spec import (
    TRIGGER_MODES,
    FileSource,
    FlowSpec,
    GoldJoinSpec,
    GoldSpec,
    KafkaSource,
    duration_seconds,
)
from quality.checks import stream_check_specs
from quality.gold_checks import gold_check_specs


class FlowRunConfig(Config):
    trigger: str | None = Field(
        default=None,
        description=f"Override the specs' trigger mode for this run ({', '.join(TRIGGER_MODES)}).",
    )
    full_refresh: bool = Field(
        default=False,
        description="Rebuild the flow's silver tables from its bronze table and swap them in "
        "(an incremental run; refused while another run of the flow holds its lease).",
    )


def flow_group(spec: FlowSpec) -> str:
    """The asset group of the flow's tables and sources: its domain (default: its name)."""
    return spec.domain or spec.name


def flow_tags(spec: FlowSpec, layer: str) -> dict[str, str]:
    """Tags of a flow's asset: the spec's own, its layer, its flow and its trigger mode."""
    return {
        **spec.tags,
        "conflux/layer": layer,
        "conflux/flow": spec.name,
        "conflux/trigger": spec.trigger.mode,
    }


def ownership(spec: FlowSpec, layer: str) -> dict[str, Any]:
    """Group, owners and tags of a flow's asset in ``layer`` (sources, bronze, silver, gold)."""
    return {"group_name": flow_group(spec), "owners": list(spec.owners),
            "tags": flow_tags(spec, layer)}  # fmt: skip


def source_specs(spec: FlowSpec) -> list[AssetSpec]:
    """External assets for the flow's source: one per Kafka topic, or the landing folder."""
    source = spec.source
    if isinstance(source, FileSource):
        return [
            AssetSpec(
                key=AssetKey(["landing", spec.name]),
                description=f"{source.format} files landing in {source.path}",
                kinds={"file"},
                **ownership(spec, "source"),
            )
        ]
    assert isinstance(source, KafkaSource)
    if source.pattern:
        named = {f"pattern_{spec.name}": f"Kafka topics matching {source.pattern}"}
    else:
        named = {topic: f"Kafka topic {topic}" for topic in source.topics}
    return [
        AssetSpec(
            key=AssetKey(["kafka", n]), description=d, kinds={"kafka"}, **ownership(spec, "source")
        )
        for n, d in named.items()
    ]


def bronze_spec(spec: FlowSpec, settings: Settings) -> AssetSpec:
    locations = FlowState.of(spec, settings)
    return AssetSpec(
        key=bronze_key(spec),
        deps=[s.key for s in source_specs(spec)],
        kinds={"spark", "delta"},
        description=spec.description or f"Bronze table of flow {spec.name} (raw, exactly once).",
        metadata={
            "table_path": str(locations.table),
            "checkpoint": str(locations.checkpoint),
            "spec_file": spec.spec_file,
            "flow": spec.name,
            "trigger": spec.trigger.mode,
        },
        skippable=True,
        **ownership(spec, "bronze"),
    )


def silver_specs(spec: FlowSpec, settings: Settings) -> list[AssetSpec]:
    """The flow's silver tables: events (from bronze), current (from events), quarantine."""
    silver = spec.silver
    if silver is None:
        return []
    catalog = FlowCatalog.of(spec, settings)
    bronze = key_of(spec, TableRole.BRONZE)
    common = {
        "flow": spec.name,
        "spec_file": spec.spec_file,
        "trigger": spec.trigger.mode,
        "format": silver.format,
        "chaining": silver.chaining,
    }
    if silver.own_query:  # bronze_batch writes under bronze's checkpoint
        common["checkpoint"] = str(catalog.state.silver_checkpoint)

    def table_spec(
        role: TableRole, upstream: AssetKey, description: str, **metadata: Any
    ) -> AssetSpec:
        table = catalog.table(role)
        return AssetSpec(
            key=key_of(spec, role),
            deps=[upstream],
            kinds={"spark", "delta"},
            description=description,
            metadata={**common, "table_path": table.location, **metadata},
            skippable=True,
            **ownership(spec, "silver"),
        )

    parsed = f"{silver.format} payloads of {spec.target.table} parsed to ({silver.schema_ddl})"
    specs = [
        table_spec(
            TableRole.EVENTS,
            bronze,
            f"Events of flow {spec.name}: {parsed}, append-only, one row per change.",
            schema=silver.schema_ddl,
            event_time=silver.event_time or "default",
        ),
        table_spec(
            TableRole.QUARANTINE,
            bronze,
            f"Quarantine of flow {spec.name}: records of {spec.target.table} that silver could "
            "not parse, raw bytes and reasons kept.",
        ),
    ]
    current = silver.current
    if current is not None:
        specs.append(
            table_spec(
                TableRole.CURRENT,
                key_of(spec, TableRole.EVENTS),
                f"Current state of flow {spec.name}: one live row per "
                f"({', '.join(current.keys)}), the latest by {silver.sequence_expression}.",
                keys=list(current.keys),
                sequence_by=silver.sequence_expression,
                deleted_key_retention=current.deleted_key_retention,
            )
        )
    history = silver.history
    if history is not None:
        tracked = history.track_history or "every non-key column" + (
            f" but {', '.join(history.track_history_except)}"
            if history.track_history_except
            else ""
        )
        specs.append(
            table_spec(
                TableRole.HISTORY,
                key_of(spec, TableRole.EVENTS),
                f"History of flow {spec.name} (SCD type 2): every version of each "
                f"({', '.join(silver.history_keys)}), valid from/to "
                f"{silver.sequence_expression}; a change of {tracked} opens a version.",
                keys=list(silver.history_keys),
                sequence_by=silver.sequence_expression,
                track_history=list(history.track_history),
                track_history_except=list(history.track_history_except),
            )
        )
    return specs


def _aggregate_asset(spec: FlowSpec, gold: GoldSpec) -> tuple[str, str, dict[str, Any]]:
    """A gold table of windowed aggregates: its description, what its late rows missed, and
    its metadata."""
    window = gold.window.duration + (
        f" sliding every {gold.window.slide}" if gold.window.slide else ""
    )
    by = f" by {', '.join(gold.group_by)}" if gold.group_by else ""
    description = (
        f"Flow {spec.name}: {', '.join(a.name for a in gold.aggregates)} per {window} window{by} "
        f"of the events' {gold.event_time}; updated as batches commit (open windows included), "
        "late rows reconciled by backfills."
    )
    metadata = {
        "event_time": gold.event_time,
        "window": window,
        "group_by": list(gold.group_by),
        "deduplicate": list(gold.deduplicate),
    }
    return description, "with the watermark at arrival and the window they missed", metadata


def _join_asset(spec: FlowSpec, gold: GoldJoinSpec) -> tuple[str, str, dict[str, Any]]:
    """A gold join: its description, what its late rows missed, and its metadata."""
    join = gold.join
    right = join.right_flow(spec.name)
    within = f"within -{join.within.before} / +{join.within.after}"
    description = (
        f"Flow {spec.name}: its events ({join.left.event_time}) {join.how.replace('_', ' ')} "
        f"joined with flow {right}'s events ({join.right.event_time}) on "
        f"{', '.join(join.keys)} {within}; pairs appended as they match"
        + (
            ", unmatched events once the watermark passes their bound"
            if join.how != "inner"
            else ""
        )
        + "; late rows reconciled by backfills."
    )
    metadata = {
        "join": join.how,
        "keys": list(join.keys),
        "within": within,
        "left_event_time": join.left.event_time,
        "right_flow": right,
        "right_event_time": join.right.event_time,
    }
    return description, "of either side (`_side`), with the watermark at arrival", metadata


def gold_specs(spec: FlowSpec, settings: Settings) -> list[AssetSpec]:
    """Per gold table: the table (windowed aggregates or a join of the events) and its late-data
    table."""
    catalog = FlowCatalog.of(spec, settings)
    specs = []
    for gold in spec.gold:
        deps = gold_input_keys(spec, gold)
        if isinstance(gold, GoldJoinSpec):
            description, missed, metadata = _join_asset(spec, gold)
        else:
            description, missed, metadata = _aggregate_asset(spec, gold)
        common = {
            "flow": spec.name,
            "spec_file": spec.spec_file,
            "trigger": spec.trigger.mode,
            "allowed_lateness": gold.allowed_lateness,
        }
        specs += [
            AssetSpec(
                key=key_of(spec, TableRole.GOLD, gold.table),
                deps=deps,
                kinds={"spark", "delta"},
                description=gold.description or description,
                metadata={
                    **common,
                    **metadata,
                    "table_path": catalog.table(TableRole.GOLD, gold.table).location,
                    "checkpoint": str(catalog.state.gold_checkpoint(gold.table)),
                },
                skippable=True,
                **ownership(spec, "gold"),
            ),
            AssetSpec(
                key=key_of(spec, TableRole.LATE, gold.table),
                deps=deps,
                kinds={"spark", "delta"},
                description=f"Late rows of gold {gold.table}: events that arrived behind the "
                f"watermark (newest event time - {gold.allowed_lateness}), {missed}; never "
                "dropped.",
                metadata={
                    **common,
                    **metadata,
                    "table_path": catalog.table(TableRole.LATE, gold.table).location,
                },
                skippable=True,
                **ownership(spec, "gold"),
            ),
        ]
    return specs


def flow_specs(spec: FlowSpec, settings: Settings) -> list[AssetSpec]:
    """Every table of the flow, bronze first: the specs of its multi-asset."""
    return [bronze_spec(spec, settings), *silver_specs(spec, settings), *gold_specs(spec, settings)]


def flow_pool(spec: FlowSpec) -> str:
    """The Dagster concurrency pool of a flow's runs (one slot: one run at a time)."""
    return f"conflux/flow/{spec.name}"


def restart_policy(spec: FlowSpec) -> RetryPolicy | None:
    """A continuous flow's Spark application that dies is started again from its checkpoint:
    ``trigger.max_restarts`` times per run, waiting 1, 3, 7, ... times ``trigger.restart_delay``.
    Refusals (bad run config, a flow another run holds) are not retried."""
    trigger = spec.trigger
    if trigger.mode != "continuous" or trigger.max_restarts == 0:
        return None
    return RetryPolicy(
        max_retries=trigger.max_restarts,
        delay=duration_seconds(trigger.restart_delay),
        backoff=Backoff.EXPONENTIAL,
    )


def flow_assets(spec: FlowSpec, settings: Settings) -> AssetsDefinition:
    """The multi-asset of one flow: launching it runs the flow's Spark application.

    Its specs are skippable (a stopped continuous run may end before a table's first write), but
    every run runs all of them: the multi-asset cannot be subset. With silver, the stream's
    checks (:mod:`quality.checks`) are evaluated on the events asset batch by batch.
    """

    events = events_key(spec)

    @multi_asset(
        name=f"flow_{spec.name}",
        specs=flow_specs(spec, settings),
        check_specs=[
            *(stream_check_specs(spec, events) if events is not None else []),
            *(
                check
                for gold in spec.gold
                for check in gold_check_specs(gold, key_of(spec, TableRole.GOLD, gold.table))
            ),
        ]
        or None,
        can_subset=False,
        pool=flow_pool(spec),
        retry_policy=restart_policy(spec),
        description=f"Flow {spec.name} ({spec.spec_file}).",
    )
    def _flow(
        context: AssetExecutionContext, config: FlowRunConfig, spark_submit: SparkSubmitResource
    ) -> Iterator[PipesExecutionResult]:
        if config.trigger is not None and config.trigger not in TRIGGER_MODES:
            raise Failure(
                f"trigger: {config.trigger!r} is not one of {', '.join(TRIGGER_MODES)}",
                allow_retries=False,
            )
        trigger = "available_now" if config.full_refresh else config.trigger
        if config.full_refresh and config.trigger not in (None, "available_now"):
            raise Failure(
                "full_refresh runs incrementally: leave trigger out or available_now",
                allow_retries=False,
            )
        if config.full_refresh and spec.silver is None:
            raise Failure(f"flow {spec.name} has no silver stage to refresh", allow_retries=False)
        yield from run_flows(context, [spec], spark_submit, trigger, config.full_refresh)

    return _flow

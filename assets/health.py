"""Stream health in Dagster: the ``stream_health`` check of each continuous flow, kept by a sensor.

A continuous flow's run stays STARTED for days, so the run's status says nothing about whether
its stream moves. Its Spark application writes a heartbeat file (:mod:`pipelines.health`); the
``conflux_stream_health`` sensor reads it every 15 seconds for every flow whose lease is held
(running, or dead without releasing it) and records the verdict as an evaluation of the
``stream_health`` asset check on the flow's bronze asset: passed when healthy (idle with lag 0
included), failed with the reason when a query was not heard from or is behind with no commit for
``trigger.stale_after``, or when its application is down while its run goes on (a restart
pending); a flow whose run ended is recorded once as not running (passed, warning). The UI
shows the check's state and history on the asset; an evaluation is recorded when the state
changes, and (but for a stopped flow) at least every :data:`REPEAT_SECONDS`. The same check
can be executed from the UI on demand.

A dead application is restarted by the flow asset's retry policy (``trigger.max_restarts``;
Dagster's exponential backoff waits 1, 3, 7, ... times ``trigger.restart_delay``): the run's
event log shows each attempt.
"""

from __future__ import annotations

import json
import time
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    DagsterInstance,
    DefaultSensorStatus,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    asset_check,
    sensor,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluation

from assets.keys import bronze_key
from pipelines.catalog.state import FlowState
from pipelines.health import Health, flow_health
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

CHECK_NAME = "stream_health"
#: Record an unchanged verdict again after this long, so the check's timestamp stays current.
REPEAT_SECONDS = 300.0


def _metadata(health: Health) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "state": MetadataValue.text(health.state),
        "reason": MetadataValue.text(health.reason),
        "lag": MetadataValue.json(health.lag),
        "seconds_since_commit": MetadataValue.json(health.seconds_since_commit),
    }
    if health.heartbeat_age_seconds is not None:
        metadata["heartbeat_age_seconds"] = MetadataValue.float(health.heartbeat_age_seconds)
    return metadata


def health_check(spec: FlowSpec, settings: Settings) -> AssetChecksDefinition:
    """``stream_health`` on the flow's bronze asset, also executable from the UI."""

    @asset_check(
        asset=bronze_key(spec),
        name=CHECK_NAME,
        blocking=False,
        description=f"Continuous flow {spec.name} is healthy: its Spark application reported "
        f"within {spec.trigger.stale_after} and no query is behind without committing. Kept "
        "by the conflux_stream_health sensor.",
    )
    def _stream_health() -> AssetCheckResult:
        health = flow_health(spec, settings)
        if health is None:
            return AssetCheckResult(
                passed=True,
                severity=AssetCheckSeverity.WARN,
                metadata={"state": MetadataValue.text("not running")},
                description=f"flow {spec.name} is not running",
            )
        return AssetCheckResult(
            passed=health.healthy, metadata=_metadata(health), description=health.reason
        )

    return _stream_health


def verdict(spec: FlowSpec, settings: Settings, instance: DagsterInstance) -> Health | None:
    """The flow's health as the sensor records it: from its heartbeat while its lease is held;
    ``down`` when its lease was released while its Dagster run goes on (the application died
    and a restart is pending); ``stopped`` after its run ended; None if it never ran."""
    health = flow_health(spec, settings)
    if health is not None:
        return health
    term = FlowState.of(spec, settings).lease_store().latest()
    if term is None:
        return None
    run_id = term.details.get("dagster_run_id")
    run = instance.get_run_by_id(run_id) if run_id else None
    if run is not None and not run.is_finished:
        return Health(
            "down",
            f"its run {run_id} is {run.status.value} but its Spark application is not running "
            "(a restart is pending, or the run is stopping)",
        )
    return Health("stopped", "not running")


def stream_health_sensor(specs: list[FlowSpec], settings: Settings) -> SensorDefinition:
    """``conflux_stream_health``: records ``stream_health`` of each running continuous flow."""

    @sensor(
        name="conflux_stream_health",
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.RUNNING,
        description="Marks continuous flows healthy or unhealthy from their heartbeats "
        "(the stream_health check on each flow's bronze asset).",
    )
    def _stream_health(context: SensorEvaluationContext) -> SkipReason:
        cursor: dict[str, Any] = json.loads(context.cursor) if context.cursor else {}
        now, verdicts = time.time(), []
        for spec in specs:
            health = verdict(spec, settings, context.instance)
            if health is None:
                continue
            verdicts.append(f"{spec.name}: {health.state}")
            last = cursor.get(spec.name) or {}
            recent = now - last.get("at", 0) < REPEAT_SECONDS or health.state == "stopped"
            if last.get("state") == health.state and recent:
                continue
            context.instance.report_runless_asset_event(
                AssetCheckEvaluation(
                    asset_key=bronze_key(spec),
                    check_name=CHECK_NAME,
                    passed=health.healthy or health.state == "stopped",
                    severity=AssetCheckSeverity.WARN
                    if health.state == "stopped"
                    else AssetCheckSeverity.ERROR,
                    metadata=_metadata(health),
                    description=health.reason,
                )
            )
            cursor[spec.name] = {"state": health.state, "at": now}
        context.update_cursor(json.dumps(cursor))
        return SkipReason("; ".join(verdicts) or "no continuous flow is running")

    return _stream_health

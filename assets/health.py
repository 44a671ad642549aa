"""Stream health in Dagster: the ``stream_health`` check of each continuous flow, kept by a sensor.

A continuous flow's run stays STARTED for days, so the run's status says nothing about whether
its stream moves. The ``conflux_stream_health`` sensor reads every flow's state every 15 seconds
(:mod:`pipelines.run_state`: the model ``conflux status`` prints, from the flow's lease, status
file and heartbeat) and records it as an evaluation of the ``stream_health`` asset check on the
flow's bronze asset: passed when running healthy (idle with lag 0 included); failed, with the
reason, when a query was not heard from or is behind with no commit for
``trigger.stale_after``, when its application is down and about to be started again
(restarting: the launcher notes it in the status file before the retry), or when its run failed
(the typed reason and the first line of the cause); a flow stopping or stopped cleanly passes
(its severity, WARN, is not shown on a passed check). A failed or stopped flow is recorded once;
any other state when it
changes, and at least every :data:`REPEAT_SECONDS`. The same check can be executed from the UI on
demand.

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
from pipelines.run_state import Phase, RunState, flow_run_state
from pipelines.settings import Settings
from pipelines.spec import FlowSpec

CHECK_NAME = "stream_health"
#: Record an unchanged verdict again after this long, so the check's timestamp stays current.
REPEAT_SECONDS = 300.0


def _metadata(state: RunState) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "state": MetadataValue.text(state.token),
        "phase": MetadataValue.text(state.phase.value),
        "reason": MetadataValue.text(
            state.summary if state.health is None else state.health.reason
        ),
    }
    if state.reason is not None:
        metadata["failure"] = MetadataValue.text(state.reason.value)
    health = state.health
    if health is not None:
        metadata["lag"] = MetadataValue.json(health.lag)
        metadata["seconds_since_commit"] = MetadataValue.json(health.seconds_since_commit)
        if health.heartbeat_age_seconds is not None:
            metadata["heartbeat_age_seconds"] = MetadataValue.float(health.heartbeat_age_seconds)
    return metadata


def _severity(state: RunState) -> AssetCheckSeverity:
    """A flow stopped cleanly or never run warns; anything else that is not ok is an error."""
    quiet = state.phase in (Phase.STOPPED, Phase.NEVER_RUN)
    return AssetCheckSeverity.WARN if quiet else AssetCheckSeverity.ERROR


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
        state = verdict(spec, settings)
        return AssetCheckResult(
            passed=state.ok,
            severity=_severity(state),
            metadata=_metadata(state),
            description=state.summary,
        )

    return _stream_health


def verdict(spec: FlowSpec, settings: Settings) -> RunState:
    """The flow's state (:mod:`pipelines.run_state`), the one ``conflux status`` prints: a
    restart pending under the flow asset's retry policy is in the flow's status file
    (``assets/launch.py`` writes the note)."""
    return flow_run_state(spec, settings)


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
            state = verdict(spec, settings)
            if state.phase is Phase.NEVER_RUN:
                continue
            verdicts.append(f"{spec.name}: {state.token}")
            last = cursor.get(spec.name) or {}
            ended = state.phase in (Phase.STOPPED, Phase.FAILED)  # recorded once
            recent = now - last.get("at", 0) < REPEAT_SECONDS or ended
            if last.get("state") == state.token and recent:
                continue
            context.instance.report_runless_asset_event(
                AssetCheckEvaluation(
                    asset_key=bronze_key(spec),
                    check_name=CHECK_NAME,
                    passed=state.ok,
                    severity=_severity(state),
                    metadata=_metadata(state),
                    description=state.summary,
                )
            )
            cursor[spec.name] = {"state": state.token, "at": now}
        context.update_cursor(json.dumps(cursor))
        return SkipReason("; ".join(verdicts) or "no continuous flow is running")

    return _stream_health

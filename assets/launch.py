"""Launch flows' Spark application through Dagster Pipes and follow it until it ends.

* ``available_now``: the child reports the asset's materialization once, when it has caught up.
* ``continuous``: Pipes accepts one materialization per asset per session, so the child reports
  each committed micro-batch as a custom message; this side turns them into throttled
  ``AssetMaterialization`` events while the run goes on, plus a heartbeat in the run's logs.

Launching, leases and stopping are :class:`pipelines.launcher.FlowApplication`'s: the flows'
leases are taken before anything starts and renewed by this run worker; when the Dagster run is
terminated, the runner's stop file is created, the in-flight batch commits and the application
exits; only past ``graceful_stop_seconds`` is the process group terminated.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    DagsterEventType,
    DagsterInstance,
    Failure,
    MetadataValue,
    PipesEnvContextInjector,
    PipesExecutionResult,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from assets.keys import bronze_key
from assets.resources import SparkSubmitResource
from assets.sensors import RUN_WORKER_TAG
from pipelines.launcher import FlowApplication
from pipelines.lease import LeaseHeldError, LeaseTerm, owner_process_gone, process_gone
from pipelines.settings import load_settings
from pipelines.sources.kafka import redacted
from pipelines.spec import FlowSpec


class RunWorkerGoneError(Exception):
    """The Dagster run worker that started this step is dead: nobody will record this run's end."""


@dataclass
class ProgressRelay:
    """Relays one flow's per-batch messages as throttled materializations."""

    context: AssetExecutionContext
    asset_key: AssetKey
    interval: float
    pending_rows: int = 0
    pending_batches: int = 0
    latest: dict[str, Any] = field(default_factory=dict)
    last_event: float = field(default_factory=time.monotonic)

    def add(self, message: dict[str, Any]) -> None:
        self.pending_rows += int(message["rows_added"])
        self.pending_batches += 1
        self.latest = message

    def flush(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.pending_batches and (final or now - self.last_event >= self.interval):
            self.context.log_event(
                AssetMaterialization(asset_key=self.asset_key, metadata=self._metadata())
            )
            self.pending_rows = self.pending_batches = 0
            self.last_event = now

    def _metadata(self) -> dict[str, Any]:
        latest = self.latest
        metadata: dict[str, Any] = {
            "rows_written": MetadataValue.int(self.pending_rows),
            "batches": MetadataValue.int(self.pending_batches),
            "replayed": MetadataValue.bool(bool(latest.get("replayed"))),
            "last_batch_id": MetadataValue.int(int(latest["batch_id"])),
            "rows_per_second": MetadataValue.float(float(latest["processed_rows_per_second"])),
            "end_offsets": MetadataValue.json(latest.get("end_offsets") or {}),
        }
        if latest.get("delta_version") is not None:
            metadata["delta_version"] = MetadataValue.int(int(latest["delta_version"]))
        if latest.get("lag") is not None:
            metadata["lag"] = MetadataValue.int(int(latest["lag"]))
        return metadata


@dataclass
class RunMonitor:
    """Follows the child's custom messages: progress relays per flow, a heartbeat, errors."""

    context: AssetExecutionContext
    relays: dict[str, ProgressRelay]
    heartbeat: float
    seen: int = 0
    errors: list[str] = field(default_factory=list)
    last_heartbeat: float = field(default_factory=time.monotonic)

    def poll(self, messages: Sequence[Any], final: bool = False) -> None:
        for message in messages[self.seen :]:
            self.seen += 1
            if not isinstance(message, dict):
                continue
            if message.get("type") == "batch" and message.get("flow") in self.relays:
                self.relays[message["flow"]].add(message)
            elif message.get("type") == "error":
                self.errors.append(str(message["message"]))
        for relay in self.relays.values():
            relay.flush(final)
        if self.relays and time.monotonic() - self.last_heartbeat >= self.heartbeat:
            lags = {f: r.latest.get("lag") for f, r in self.relays.items()}
            self.context.log.info(f"heartbeat: flows running, lag per flow {lags}")
            self.last_heartbeat = time.monotonic()


def loggable(command: list[str]) -> list[str]:
    """The command with the values of secret-looking ``--conf`` settings replaced by ``***``."""
    shown = []
    for arg in command:
        key, sep, value = arg.partition("=")
        shown.append(
            f"{key}={redacted({key: value})[key]}" if sep and key.startswith("spark.") else arg
        )
    return shown


def owner_gone(instance: DagsterInstance) -> Callable[[LeaseTerm], bool]:
    """A lease owner is gone if its process died here, or if it was a Dagster run that ended.

    Used when taking the lease: a retry or relaunch after a dead run worker waits (at most one
    lease period) for the dead owner's lease to expire, while its orphaned application stops.
    """

    def gone(term: LeaseTerm) -> bool:
        if owner_process_gone(term):
            return True
        run_id = term.details.get("dagster_run_id")
        if not run_id:
            return False
        run = instance.get_run_by_id(run_id)
        return run is None or run.is_finished

    return gone


def run_worker_pid(context: AssetExecutionContext) -> int:
    """The pid of the process running this Dagster run (the step may run in a child of it)."""
    started = context.instance.get_records_for_run(
        context.run_id, of_type=DagsterEventType.RUN_START, limit=1
    ).records
    for record in started:
        event = record.event_log_entry.dagster_event
        if event is not None and event.pid:
            return int(event.pid)
    return os.getpid()


def run_flows(
    context: AssetExecutionContext,
    specs: list[FlowSpec],
    spark_submit: SparkSubmitResource,
    trigger: str | None = None,
) -> Iterator[PipesExecutionResult]:
    """Run ``specs`` in one Spark application under Pipes; yield the results it reported.

    ``trigger`` overrides the specs' trigger modes; a run with any continuous flow is followed
    live (throttled materializations per committed batch) until it is stopped. The flows' leases
    are taken before anything starts: a flow that is already running fails this run at once.
    """
    keys = {spec.name: bronze_key(spec) for spec in specs}
    continuous = any((trigger or spec.trigger.mode) == "continuous" for spec in specs)
    extras = {"asset_keys": {name: key.to_user_string() for name, key in keys.items()}}
    relays = {
        name: ProgressRelay(context, key, spark_submit.progress_interval_seconds)
        for name, key in keys.items()
    }
    monitor = RunMonitor(context, relays if continuous else {}, spark_submit.heartbeat_seconds)
    worker_pid = run_worker_pid(context)
    context.instance.add_run_tags(
        context.run_id, {RUN_WORKER_TAG: f"{socket.gethostname()}:{worker_pid}"}
    )
    with open_pipes_session(
        context=context,
        context_injector=PipesEnvContextInjector(),
        message_reader=PipesTempFileMessageReader(),
        extras=extras,
    ) as session:
        application = FlowApplication(
            specs,
            load_settings(),
            spark_submit.launcher(),
            trigger,
            owner_kind="dagster",
            details={"dagster_run_id": context.run_id, "run_worker_pid": str(worker_pid)},
            env=session.get_bootstrap_env_vars(),
            wait_for_expiry_of=owner_gone(context.instance),
            on_lease_lost=context.log.error,
            graceful_stop_seconds=spark_submit.graceful_stop_seconds,
        )
        try:
            with ExitStack() as running:
                try:
                    running.enter_context(application)  # stopped and its leases freed on exit
                except LeaseHeldError as exc:
                    raise Failure(description=str(exc)) from exc
                context.log.info(
                    f"launching (lease owner {application.owner}): "
                    f"{' '.join(loggable(application.command()))}"
                )
                try:
                    while application.poll() is None:
                        monitor.poll(session.get_custom_messages())
                        if process_gone(socket.gethostname(), worker_pid):
                            raise RunWorkerGoneError(
                                f"the run worker (pid {worker_pid}) died: stopping the flows"
                            )
                        time.sleep(1.0)
                except BaseException:
                    context.log.info(
                        "run terminated: stopping the streams after their in-flight batch"
                    )
                    raise
        finally:
            # Also after a terminate: the batch that committed while stopping is reported.
            monitor.poll(session.get_custom_messages(), final=True)
        returncode = application.wait()
        if returncode != 0:
            raise Failure(
                description=(
                    f"flows {', '.join(keys)}: the Spark application exited with code "
                    f"{returncode}: {' | '.join(monitor.errors) or 'see stderr in the logs'}"
                )
            )
    yield from session.get_results(implicit_materializations=False)

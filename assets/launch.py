"""Launch flows' Spark application through Dagster Pipes and follow it until it ends.

* ``available_now``: the child reports the asset's materialization once, when it has caught up.
* ``continuous``: Pipes accepts one materialization per asset per session, so the child reports
  each committed micro-batch as a custom message; this side turns them into throttled
  ``AssetMaterialization`` events while the run goes on, plus a heartbeat in the run's logs.

Stopping: when the Dagster run is terminated, the launcher creates the runner's stop file, waits
for the in-flight batch to commit and the application to exit, and only then, past
``graceful_stop_seconds``, terminates the process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    Failure,
    MetadataValue,
    PipesEnvContextInjector,
    PipesExecutionResult,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from assets.keys import bronze_key
from assets.resources import SparkSubmitResource
from pipelines.sources.kafka import redacted
from pipelines.spec import FlowSpec


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
        self.pending_rows += int(message["input_rows"])
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


def stop_gracefully(process: subprocess.Popen[bytes], stop_file: Path, timeout: float) -> None:
    """Ask the runner to stop via its stop file; escalate to SIGTERM, then SIGKILL, if it hangs."""
    stop_file.touch()
    for sig, wait in ((None, timeout), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if sig is not None:
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_flows(
    context: AssetExecutionContext,
    specs: list[FlowSpec],
    spark_submit: SparkSubmitResource,
    trigger: str | None = None,
) -> Iterator[PipesExecutionResult]:
    """Run ``specs`` in one Spark application under Pipes; yield the results it reported.

    ``trigger`` overrides the specs' trigger modes; a run with any continuous flow is followed
    live (throttled materializations per committed batch) until it is stopped.
    """
    keys = {spec.name: bronze_key(spec) for spec in specs}
    continuous = any((trigger or spec.trigger.mode) == "continuous" for spec in specs)
    extras = {"asset_keys": {name: key.to_user_string() for name, key in keys.items()}}
    relays = {
        name: ProgressRelay(context, key, spark_submit.progress_interval_seconds)
        for name, key in keys.items()
    }
    monitor = RunMonitor(context, relays if continuous else {}, spark_submit.heartbeat_seconds)
    with tempfile.TemporaryDirectory(prefix="conflux-run-") as scratch:
        stop_file = Path(scratch) / "stop"
        command = spark_submit.command([Path(s.spec_file) for s in specs], trigger, stop_file)
        context.log.info(f"launching: {' '.join(loggable(command))}")
        with open_pipes_session(
            context=context,
            context_injector=PipesEnvContextInjector(),
            message_reader=PipesTempFileMessageReader(),
            extras=extras,
        ) as session:
            env = {**os.environ, **spark_submit.environment(), **session.get_bootstrap_env_vars()}
            process = subprocess.Popen(command, env=env, start_new_session=True)
            try:
                while process.poll() is None:
                    monitor.poll(session.get_custom_messages())
                    time.sleep(1.0)
            except BaseException:
                context.log.info("run terminated: stopping the streams after their in-flight batch")
                stop_gracefully(process, stop_file, spark_submit.graceful_stop_seconds)
                raise
            monitor.poll(session.get_custom_messages(), final=True)
            if process.returncode != 0:
                raise Failure(
                    description=(
                        f"flows {', '.join(keys)}: the Spark application exited with code "
                        f"{process.returncode}: {' | '.join(monitor.errors) or 'see stderr in the logs'}"
                    )
                )
        yield from session.get_results(implicit_materializations=False)

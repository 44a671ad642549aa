"""Where the runner reports progress: JSON lines on stdout, and Dagster Pipes when launched by it.

What it reports are the messages of :mod:`pipelines.messages`, serialized with their
``to_json()``: committed batches (stdout, Pipes, the flow's ``_status.json``), stages started,
flows stopped and why (Pipes, ``_status.json``), errors (Pipes; errors and logs also on stderr).

The Pipes reporter is the data plane's only link to the orchestrator, and it uses the
dependency-free ``dagster_pipes`` protocol package, imported only when the process was launched
through Pipes (``DAGSTER_PIPES_CONTEXT`` is set): under a plain ``spark-submit`` nothing of Dagster
is imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from pipelines.catalog.roles import TableRole, role_id
from pipelines.catalog.state import write_json_atomically
from pipelines.location import Location
from pipelines.messages import BatchCommitted, ErrorReported, FlowStopped, StageStarted, StopReason
from pipelines.status import FlowStatus, SupervisorNote

PROGRESS_PREFIX = "conflux.progress "
#: Stops of a run whose flow another owner holds: its status file is that owner's to write.
NOT_OURS = frozenset({StopReason.LEASE_LOST, StopReason.LEASE_HELD})
SUMMARY_PREFIX = "conflux.summary "


def _line(prefix: str, payload: dict[str, Any]) -> str:
    return prefix + json.dumps(payload, default=str, sort_keys=True)


def _last_batch(status_file: Location) -> BatchCommitted | None:
    """The last batch an earlier run recorded in ``status_file`` (None: none, or unreadable:
    ``conflux status`` names that problem; the runner only rewrites the file)."""
    try:
        return FlowStatus.parse(json.loads(status_file.read_text())).last_batch
    except (OSError, ValueError):  # MessageError is a ValueError
        return None


class Reporter:
    """Reports batches, logs and final per-flow summaries to every configured channel.

    Channels: JSON lines on stdout, Dagster Pipes when launched by it, and each flow's status file
    (:attr:`FlowState.status_file`, read by ``conflux status``) once :meth:`track_status`
    named them: the last batch, and how the run ended.
    """

    def __init__(self, pipes: Any | None = None) -> None:
        self._pipes = pipes
        self._status_files: dict[str, Location] = {}
        self._owner: str | None = None
        #: Each tracked flow's last committed batch: this run's, or (none yet) the file's.
        self._last_batches: dict[str, BatchCommitted | None] = {}
        #: Each flow's note of a query waiting for its source (:mod:`pipelines.outages`).
        self._notes: dict[str, SupervisorNote] = {}

    def track_status(self, status_files: Mapping[str, Location], owner: str) -> None:
        """Also write each flow's last batch, and its stop, to its status file, as lease owner
        ``owner``'s, starting now (a run killed before it reports an end leaves a status with
        none). Only flows whose lease this run holds: a refused start writes nothing."""
        self._status_files = dict(status_files)
        self._owner = owner
        self._last_batches = {flow: _last_batch(path) for flow, path in status_files.items()}
        for flow, path in self._status_files.items():  # this run's, with no end yet
            write_json_atomically(path, FlowStatus(owner, self._last_batches[flow]).to_json())

    @property
    def under_pipes(self) -> bool:
        return self._pipes is not None

    def batch(self, progress: BatchCommitted) -> None:
        payload = progress.to_json()
        print(_line(PROGRESS_PREFIX, payload), flush=True)
        if progress.replayed:
            self.info(
                f"flow {progress.flow}: batch {progress.batch_id} was a replay of a batch Delta "
                "had already committed; Delta skipped it (nothing written twice)"
            )
        if self._pipes is not None:
            self._pipes.report_custom_message(payload)
        status_file = self._status_files.get(progress.flow)
        if status_file is not None:
            self._last_batches[progress.flow] = progress
            note = self._notes.get(progress.flow)  # another query of the flow may still wait
            status = FlowStatus(self._owner, progress, supervision=note)
            write_json_atomically(status_file, status.to_json())

    def started(self, started: StageStarted) -> None:
        """A stage's query started (Pipes only: the log line says so on stderr)."""
        if self._pipes is not None:
            self._pipes.report_custom_message(started.to_json())

    def stopped(self, stopped: FlowStopped) -> None:
        """A flow stopped, and why: to Pipes and into the flow's status file (an error was
        reported as it happened)."""
        if self._pipes is not None:
            self._pipes.report_custom_message(stopped.to_json())
        self._notes.pop(stopped.flow, None)
        status_file = self._status_files.get(stopped.flow)
        if status_file is not None and stopped.reason not in NOT_OURS:
            last = self._last_batches.get(stopped.flow)
            write_json_atomically(status_file, FlowStatus(self._owner, last, stopped).to_json())

    def supervising(self, flow: str, note: SupervisorNote | None) -> None:
        """A query of ``flow`` waits inside this run (``note``), or no longer does (None): into
        the flow's status file, beside its last batch, and kept there by the flow's next batches
        (another of its queries may commit meanwhile) until cleared or the flow stops."""
        if note is None:
            self._notes.pop(flow, None)
        else:
            self._notes[flow] = note
        status_file = self._status_files.get(flow)
        if status_file is not None:
            last = self._last_batches.get(flow)
            status = FlowStatus(self._owner, last, supervision=note)
            write_json_atomically(status_file, status.to_json())

    def info(self, message: str) -> None:
        print(f"conflux: {message}", file=sys.stderr, flush=True)
        if self._pipes is not None:
            self._pipes.log.info(message)

    def error(self, message: str) -> None:
        print(f"conflux: ERROR {message}", file=sys.stderr, flush=True)
        if self._pipes is not None:
            self._pipes.log.error(message)
            self._pipes.report_custom_message(ErrorReported(message).to_json())

    def finished(self, summaries: list[dict[str, Any]]) -> None:
        """Report each stage's totals; under Pipes, as the materialization of each table's asset.

        The launcher names the asset of each table in the Pipes extras ``asset_keys``:
        ``"<flow>/<role>"`` (role: bronze, events, current, quarantine, history, ``gold/<table>``,
        ``late/<table>``); ``"<flow>"`` is bronze. Roles without an asset (gold's input table) are
        not reported.
        """
        for summary in summaries:
            print(_line(SUMMARY_PREFIX, summary), flush=True)
            if self._pipes is None:
                continue
            asset_keys = self._pipes.extras.get("asset_keys", {})
            for role, table in summary["tables"].items():
                asset_key = asset_keys.get(f"{summary['flow']}/{role}")
                if asset_key is None and role == role_id(TableRole.BRONZE):
                    asset_key = asset_keys.get(summary["flow"])
                if asset_key:
                    self._pipes.report_asset_materialization(
                        asset_key=asset_key, metadata=table_metadata(summary, table)
                    )


def materialization_metadata(summary: dict[str, Any]) -> dict[str, Any]:
    """Pipes metadata (raw values with explicit types) for a flow's summary."""
    metadata: dict[str, Any] = {
        "rows_written": {"raw_value": summary["rows_written"], "type": "int"},
        "dagster/row_count_delta": {"raw_value": summary["rows_written"], "type": "int"},
        "batches": {"raw_value": summary["batches"], "type": "int"},
        "replayed_batches": {"raw_value": summary["replayed_batches"], "type": "int"},
        "duration_seconds": {"raw_value": summary["duration_seconds"], "type": "float"},
        "table_path": {"raw_value": summary["table_path"], "type": "path"},
        "end_offsets": {"raw_value": summary["end_offsets"] or {}, "type": "json"},
    }
    if summary["delta_version"] is not None:
        metadata["delta_version"] = {"raw_value": summary["delta_version"], "type": "int"}
    if summary["lag"] is not None:
        metadata["lag"] = {"raw_value": summary["lag"], "type": "int"}
    return metadata


def table_metadata(summary: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """Pipes metadata of one table a stage wrote: the stage's totals, this table's rows."""
    metadata = materialization_metadata(summary)
    metadata["rows_written"] = {"raw_value": int(table["rows"]), "type": "int"}
    metadata["dagster/row_count_delta"] = {"raw_value": int(table["rows"]), "type": "int"}
    if table.get("path"):
        metadata["table_path"] = {"raw_value": table["path"], "type": "path"}
    if table.get("version") is not None:
        metadata["delta_version"] = {"raw_value": table["version"], "type": "int"}
    metadata["stage"] = {"raw_value": summary["stage"], "type": "text"}
    return metadata


def open_reporter(stack: ExitStack) -> Reporter:
    """A reporter; under Dagster Pipes it also holds the Pipes context (closed by ``stack``)."""
    if not os.environ.get("DAGSTER_PIPES_CONTEXT"):
        return Reporter()
    from dagster_pipes import open_dagster_pipes

    return Reporter(stack.enter_context(open_dagster_pipes()))

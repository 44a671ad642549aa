"""Launch flows' Spark application through Dagster Pipes and follow it until it ends.

A flow's multi-asset has one asset per table (bronze, and silver's events, quarantine, current).
The child reports each committed micro-batch of each stage as a custom message whose ``writes``
name the tables it wrote (``table``, ``role``, ``version``, ``rows``, ``skipped``); this side maps
each write to its table's asset key.

* ``available_now``: the child reports each table's materialization once, when it has caught up
  (Pipes extras ``asset_keys``: ``"<flow>/<role>"`` -> asset key); a table it reported none for
  gets one here, with the totals of the writes relayed during the run, so every asset of the flow
  has a materialization when the run ends.
* ``continuous``: Pipes accepts one materialization per asset per session, so this side turns the
  batch messages into throttled ``AssetMaterialization`` events per table while the run goes on,
  plus a heartbeat in the run's logs.

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
    MaterializeResult,
    MetadataValue,
    PipesEnvContextInjector,
    PipesExecutionResult,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from assets.keys import events_key, flow_table_keys, key_of
from assets.lineage import column_lineage
from assets.resources import SparkSubmitResource
from assets.sensors import RUN_WORKER_TAG
from assets.table_facts import TableFacts
from pipelines.catalog.roles import TableRole, role_id
from pipelines.catalog.tables import declared_paths
from pipelines.launcher import FlowApplication
from pipelines.lease import LeaseHeldError, LeaseTerm, owner_process_gone, process_gone
from pipelines.messages import (
    QUALITY_COUNTS,
    BatchCommitted,
    BatchQuality,
    ErrorReported,
    FlowStopped,
    MessageError,
    StageStarted,
    StopReason,
    TableWrite,
    parse_message,
)
from pipelines.runner import EXIT_CONFIG, EXIT_LEASE
from pipelines.settings import load_settings
from pipelines.sources.kafka import redacted
from pipelines.spec import FlowSpec
from pipelines.supervisor import note_pending_restart, unrecorded_exit
from quality.checks import RUN_FIRST_BATCH_ID, StreamChecks
from quality.gold_checks import GoldChecks


class RunWorkerGoneError(Exception):
    """The Dagster run worker that started this step is dead: nobody will record this run's end."""


@dataclass(frozen=True)
class FlowTables:
    """Where a flow's writes land: the asset key of each of its tables, by name and by role."""

    by_table: dict[str, AssetKey]
    by_role: dict[str, AssetKey]

    @classmethod
    def of(cls, spec: FlowSpec) -> FlowTables:
        by_role = flow_table_keys(spec)
        return cls({key.path[-1]: key for key in by_role.values()}, by_role)

    def writes_of(self, batch: BatchCommitted) -> list[tuple[AssetKey, TableWrite]]:
        """The batch's writes of the flow's tables, each with its table's asset key. A bronze
        batch that lists none (a runner from before silver) wrote the bronze table: its write
        is the batch's ``delta_version``, ``rows_added`` and ``replayed``."""
        writes = batch.writes
        if not writes and batch.is_bronze:
            bronze = role_id(TableRole.BRONZE)
            table = self.by_role[bronze].path[-1]
            writes = (
                TableWrite(table, bronze, batch.delta_version, batch.rows_added, batch.replayed),
            )
        return [(self.by_table[w.table], w) for w in writes if w.table in self.by_table]


def pipes_asset_keys(tables: dict[str, FlowTables]) -> dict[str, str]:
    """The Pipes extra ``asset_keys`` the child reports materializations with
    (:meth:`pipelines.reporting.Reporter.finished`): ``"<flow>/<role>"`` -> the asset key of
    that table, and ``"<flow>"`` -> its bronze table's."""
    names: dict[str, str] = {}
    for flow, flow_tables in tables.items():
        names[flow] = flow_tables.by_role[role_id(TableRole.BRONZE)].to_user_string()
        for role, key in flow_tables.by_role.items():
            names[f"{flow}/{role}"] = key.to_user_string()
    return names


def progress_figures(batch: BatchCommitted) -> dict[str, Any]:
    """The numbers of a batch the UI plots over time: rate, duration, lag, state size."""
    figures: dict[str, Any] = {"batch_duration_ms": MetadataValue.int(batch.batch_duration_ms)}
    if batch.lag is not None:
        figures["lag"] = MetadataValue.int(batch.lag)
    if batch.lag_versions is not None:
        figures["lag_versions"] = MetadataValue.int(batch.lag_versions)
    state = batch.state or {}
    if state:
        figures["state_rows"] = MetadataValue.int(int(state.get("rows_total") or 0))
        figures["state_memory_bytes"] = MetadataValue.int(int(state.get("memory_bytes") or 0))
    return figures


@dataclass
class ProgressRelay:
    """Relays the writes of one table (one asset key) as throttled materializations.

    It also keeps the run's totals for the table, the metadata of the materialization this side
    reports at the end of an ``available_now`` run when the child reported none for the table.
    """

    context: AssetExecutionContext
    asset_key: AssetKey
    interval: float
    pending_rows: int = 0
    pending_batches: int = 0
    pending_skipped: int = 0
    total_rows: int = 0
    total_batches: int = 0
    total_skipped: int = 0
    version: int | None = None
    #: The run's first batch that wrote the table: with ``last_batch_id``, the batches of the run
    #: (a GX suite with ``scope: run`` checks the rows they added).
    first_batch_id: int | None = None
    latest: BatchCommitted | None = None
    latest_write: TableWrite | None = None
    last_event: float = field(default_factory=time.monotonic)
    #: Silver's events table: the quality counts of the batches since the last event.
    pending_quality: dict[str, int] = field(default_factory=dict)
    #: The table's schema, row count, version, latest commits and lineage, on every event.
    table: TableFacts | None = None

    def facts(self) -> dict[str, Any]:
        return {} if self.table is None else self.table.read()

    def add(self, batch: BatchCommitted, write: TableWrite) -> None:
        skipped = int(write.skipped)
        self.pending_rows += write.rows
        self.pending_batches += 1
        self.pending_skipped += skipped
        self.total_rows += write.rows
        self.total_batches += 1
        self.total_skipped += skipped
        if write.version is not None:
            self.version = write.version
        if self.first_batch_id is None:
            self.first_batch_id = batch.batch_id
        self.latest = batch
        self.latest_write = write

    def add_quality(self, quality: BatchQuality) -> None:
        """Sum a silver batch's row counts and expectation failures into the next event (which
        only a batch that wrote the table makes: counts alone are not a materialization)."""
        counts = {name: int(getattr(quality, name)) for name in QUALITY_COUNTS}
        for outcome in quality.expectations:
            counts[f"failed_{outcome.name}"] = outcome.failed
        for name, value in counts.items():
            self.pending_quality[name] = self.pending_quality.get(name, 0) + value

    def flush(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.pending_batches and (final or now - self.last_event >= self.interval):
            self.context.log_event(
                AssetMaterialization(asset_key=self.asset_key, metadata=self._metadata())
            )
            self.pending_rows = self.pending_batches = self.pending_skipped = 0
            self.pending_quality = {}
            self.last_event = now

    def _metadata(self) -> dict[str, Any]:
        quality = {f"quality_{k}": MetadataValue.int(v) for k, v in self.pending_quality.items()}
        latest, write = self.latest, self.latest_write
        assert latest is not None and write is not None, "only a table written has an event"
        metadata: dict[str, Any] = {
            **quality,
            "rows_written": MetadataValue.int(self.pending_rows),
            "batches": MetadataValue.int(self.pending_batches),
            "replayed": MetadataValue.bool(write.skipped),
            "replayed_batches": MetadataValue.int(self.pending_skipped),
            "stage": MetadataValue.text(latest.stage),
            "last_batch_id": MetadataValue.int(latest.batch_id),
            **self._first_batch(),
            "rows_per_second": MetadataValue.float(latest.processed_rows_per_second),
            "end_offsets": MetadataValue.json(latest.end_offsets or {}),
        }
        if write.version is not None:
            metadata["delta_version"] = MetadataValue.int(write.version)
        metadata.update(progress_figures(latest))
        return {**self.facts(), **metadata}

    def _first_batch(self) -> dict[str, Any]:
        if self.first_batch_id is None:
            return {}
        return {RUN_FIRST_BATCH_ID: MetadataValue.int(self.first_batch_id)}

    def batch_range(self) -> dict[str, Any]:
        """The first and last batch of the run that wrote the table (none: empty)."""
        if self.latest is None:
            return {}
        return {
            **self._first_batch(),
            "last_batch_id": MetadataValue.int(self.latest.batch_id),
        }

    def run_metadata(self) -> dict[str, Any]:
        """The whole run's totals for the table (the end-of-run materialization's metadata)."""
        metadata: dict[str, Any] = {
            "rows_written": MetadataValue.int(self.total_rows),
            "batches": MetadataValue.int(self.total_batches),
            "replayed_batches": MetadataValue.int(self.total_skipped),
        }
        metadata.update(self.batch_range())
        if self.version is not None:
            metadata["delta_version"] = MetadataValue.int(self.version)
        return {**self.facts(), **metadata}


@dataclass
class RunMonitor:
    """Follows the child's custom messages: progress per table, a heartbeat, errors.

    Every batch message's writes go to their table's relay, which keeps the run's totals;
    ``live`` relays (continuous runs) also report throttled materializations as batches commit.
    """

    context: AssetExecutionContext
    tables: dict[str, FlowTables]
    relays: dict[AssetKey, ProgressRelay]
    heartbeat: float
    live: bool = True
    #: At most one round of stream check evaluations per this many seconds (unless one changes).
    evaluation_interval: float = 15.0
    seen: int = 0
    errors: list[str] = field(default_factory=list)
    #: Why each flow stopped, as the child reported it.
    stops: list[FlowStopped] = field(default_factory=list)
    #: The stages whose queries started.
    started: list[StageStarted] = field(default_factory=list)
    lags: dict[str, Any] = field(default_factory=dict)
    #: Per flow with silver: the run's totals of its stream checks (:mod:`quality.checks`).
    checks: dict[str, StreamChecks] = field(default_factory=dict)
    #: Per (flow, gold table): the run's totals of its checks (:mod:`quality.gold_checks`).
    gold_checks: dict[tuple[str, str], GoldChecks] = field(default_factory=dict)
    #: When each check group (by id) was last logged.
    last_evaluated: dict[int, float] = field(default_factory=dict)
    last_heartbeat: float = field(default_factory=time.monotonic)

    def poll(self, messages: Sequence[Any], final: bool = False) -> None:
        for raw in messages[self.seen :]:
            self.seen += 1
            try:
                message = parse_message(raw)
            except MessageError as exc:
                self.context.log.warning(f"a message from the Spark application ignored: {exc}")
                continue
            if isinstance(message, BatchCommitted) and message.flow in self.tables:
                self._batch(message)
            elif isinstance(message, ErrorReported):
                self.errors.append(message.message)
            elif isinstance(message, FlowStopped):
                self.stops.append(message)
            elif isinstance(message, StageStarted):
                self.started.append(message)
        if not self.live:
            return
        for relay in self.relays.values():
            relay.flush(final)
        if self.relays and time.monotonic() - self.last_heartbeat >= self.heartbeat:
            self.context.log.info(f"heartbeat: flows running, lag per flow {self.lags}")
            self.last_heartbeat = time.monotonic()

    def _batch(self, batch: BatchCommitted) -> None:
        flow = batch.flow
        if batch.is_bronze:
            self.lags[flow] = batch.lag
        # The checks (quality/) read the batch as the JSON object the child sent.
        if isinstance(batch.quality, BatchQuality) and flow in self.checks and batch.is_silver:
            checks = self.checks[flow]
            self._evaluate(checks, checks.add(batch.to_json()))
            relay = self.relays.get(checks.events)
            if relay is not None:
                relay.add_quality(batch.quality)
        if batch.gold_table is not None:
            gold = self.gold_checks.get((flow, batch.gold_table))
            if gold is not None:
                self._evaluate(gold, gold.add(batch.to_json()))
        for key, write in self.tables[flow].writes_of(batch):
            if key in self.relays:
                self.relays[key].add(batch, write)

    def _evaluate(self, checks: StreamChecks | GoldChecks, changed: bool) -> None:
        """Log a check group's run so far: at once when a status changed, else at most once
        per evaluation interval."""
        last = self.last_evaluated.get(id(checks), 0.0)
        if changed or time.monotonic() - last >= self.evaluation_interval:
            for evaluation in checks.evaluations():
                self.context.log_event(evaluation)
            self.last_evaluated[id(checks)] = time.monotonic()

    def report_stops(self) -> bool:
        """A flow stopped by a ``fail`` expectation or schema-change policy: that check fails,
        with the error. Returns whether any flow stopped so (running it again would stop it
        again: not a crash to restart)."""
        stopped = False
        for stop in self.stops:
            checks = self.checks.get(stop.flow)
            if checks is None or not stop.reason.repeats_on_restart:
                continue
            for name in stop.expectations:
                checks.fail_expectation(name, stop.message)
            if stop.reason is StopReason.SCHEMA_CHANGE_REFUSED:
                checks.fail_schema_change(stop.message)
            stopped = True
            for evaluation in checks.evaluations():
                self.context.log_event(evaluation)
        return stopped


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
    full_refresh: bool = False,
) -> Iterator[PipesExecutionResult]:
    """Run ``specs`` in one Spark application under Pipes; yield the results it reported.

    ``full_refresh`` rebuilds the flows' silver tables from bronze (an ``available_now`` run; see
    :mod:`pipelines.silver.refresh`).
    ``trigger`` overrides the specs' trigger modes; a run with any continuous flow is followed
    live (throttled materializations per table as batches commit) until it is stopped. The
    flows' leases are taken before anything starts: a flow that is already running fails this
    run at once. When an ``available_now`` run ends, every table of its flows has a
    materialization: the child's, or one made here from the writes the child relayed.
    """
    tables = {spec.name: FlowTables.of(spec) for spec in specs}
    continuous = any((trigger or spec.trigger.mode) == "continuous" for spec in specs)
    extras = {"asset_keys": pipes_asset_keys(tables)}
    settings = load_settings()
    lineage = {key: deps for spec in specs for key, deps in column_lineage(spec).items()}
    paths = {spec.name: declared_paths(spec, settings) for spec in specs}
    relays = {
        key: ProgressRelay(
            context,
            key,
            spark_submit.progress_interval_seconds,
            table=TableFacts(paths[spec.name][table_id], lineage.get(key)),
        )
        for spec in specs
        for table_id, key in tables[spec.name].by_role.items()
    }
    monitor = RunMonitor(
        context,
        tables,
        relays,
        spark_submit.heartbeat_seconds,
        live=continuous,
        evaluation_interval=spark_submit.progress_interval_seconds,
    )
    for spec in specs:
        events = events_key(spec)
        if events is not None:
            monitor.checks[spec.name] = StreamChecks(spec, events)
            monitor.last_evaluated[id(monitor.checks[spec.name])] = time.monotonic()
        for gold in spec.gold:
            key = key_of(spec, TableRole.GOLD, gold.table)
            monitor.gold_checks[(spec.name, gold.table)] = GoldChecks(gold, key)
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
            settings,
            spark_submit.launcher(),
            trigger,
            runner_args=("--full-refresh",) if full_refresh else (),
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
                    raise Failure(description=str(exc), allow_retries=False) from exc
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
            stopped_by_policy = monitor.report_stops()
            final = stopped_by_policy or any(stop.reason.final for stop in monitor.stops)
            retried = returncode not in (EXIT_CONFIG, EXIT_LEASE) and not final
            if retried and continuous:  # the retry policy starts it again: the state says so
                cause = " | ".join(monitor.errors) or unrecorded_exit(returncode)
                note_pending_restart(
                    specs, settings, application.owner, context.retry_number + 1, cause, worker_pid
                )
            raise Failure(
                description=(
                    f"flows {', '.join(tables)}: the Spark application exited with code "
                    f"{returncode}: {' | '.join(monitor.errors) or 'see stderr in the logs'}"
                ),
                # A crash or a kill may pass on a restart; a refusal or a policy stop would not.
                allow_retries=retried,
            )
    reported: set[AssetKey] = set()
    quality = {totals.events: totals.metadata() for totals in monitor.checks.values()}
    for result in session.get_results(implicit_materializations=False):
        if isinstance(result, MaterializeResult) and result.asset_key is not None:
            raw = result.asset_key
            key = AssetKey.from_escaped_user_string(raw) if isinstance(raw, str) else raw
            reported.add(key)
            # The run's batches, and (the events table) its quality counts, beside the child's.
            relay = relays.get(key)
            extra = {
                **(relay.facts() if relay else {}),
                **(relay.batch_range() if relay else {}),
                **quality.get(key, {}),
            }
            if extra:
                result = MaterializeResult(
                    asset_key=key,
                    metadata={**(result.metadata or {}), **extra},
                    check_results=result.check_results,
                    data_version=result.data_version,
                    tags=result.tags,
                )
        yield result
    for spec in specs:
        if spec.name in monitor.checks:
            yield from monitor.checks[spec.name].results()
        for gold in spec.gold:
            yield from monitor.gold_checks[(spec.name, gold.table)].results()
        if (trigger or spec.trigger.mode) != "available_now":
            continue  # a stopped continuous run: its tables' progress was reported as it went
        for key in tables[spec.name].by_role.values():
            if key not in reported:
                metadata = {**relays[key].run_metadata(), **quality.get(key, {})}
                yield MaterializeResult(asset_key=key, metadata=metadata)

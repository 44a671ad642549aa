"""The stream runner: one Spark application running one or several flows, all their stages.

Run it with ``spark-submit pipelines/runner.py --spec flows/orders.yaml [--spec ...]`` (what the
launchers do: :mod:`pipelines.launcher`, used by Dagster and ``conflux run``) or
``python -m pipelines.runner ...`` for an embedded run.

* One writer per flow: with ``--lease-owner`` the launcher holds each flow's lease and renews it;
  the runner checks, before starting Spark, that the leases are that owner's, and exits 3
  otherwise. Without it the runner takes the leases itself (it is its own launcher) and exits 3,
  before Spark starts, if another owner holds one. While running, it checks the lease before
  every micro-batch and every half second, and stops at once when it lost it (exit 3).
* ``available_now`` flows run until they have caught up with their source, then the runner exits 0.
* ``continuous`` flows run until stopped: SIGTERM / SIGINT, the ``--stop-file`` appearing, or the
  flow's stop channel (``conflux stop``, :meth:`FlowState.stop_file`), which also works where
  signals do not reach the driver (a cluster). The runner then waits for each query's in-flight
  micro-batch to commit, stops the queries and exits 0.
* If any query fails, the runner stops the others and exits 1, so a failed Spark job never looks
  like a success; the Spark error is printed to stderr (and to Dagster's logs under Pipes).
* A misconfiguration (a bad spec, a flow whose checkpoint and table disagree) exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import check_locations
from pipelines.delta_writes import wait_for_background_work
from pipelines.errors import ConfigError
from pipelines.executors import executors_report
from pipelines.flow import FlowPipeline
from pipelines.health import HeartbeatWriter
from pipelines.identity import checkpoint_has_offsets
from pipelines.lease import (
    IN_PROCESS_LAUNCHER,
    FlowLease,
    LeaseGuard,
    LeaseHeldError,
    LeaseLostError,
    held_leases,
    new_owner_id,
    owner_details,
)
from pipelines.location import Location
from pipelines.messages import FlowStopped, StopReason
from pipelines.outages import SourceOutages
from pipelines.phases import Phases, readers_last
from pipelines.progress import BatchFailures, ProgressTracker, flow_of_query
from pipelines.reporting import Reporter, open_reporter
from pipelines.settings import Settings, load_settings
from pipelines.silver.refresh import resume_swap
from pipelines.spark import get_spark_session
from pipelines.spec import TRIGGER_MODES, FlowSpec, load_spec
from pipelines.stopping import (
    StopRequest,
    last_batch_id,
    stop_after_inflight_batches,
)
from pipelines.stops import disk_full, failure_stop, query_exception, stop_reason

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_LEASE = 0, 1, 2, 3
POLL_SECONDS = 0.5


def first_failure(
    queries: dict[str, StreamingQuery], waiting: Collection[str] = ()
) -> tuple[str, str] | None:
    """(name, Spark's error) of the first query that failed, but those ``waiting`` for their
    source (:mod:`pipelines.outages`)."""
    for name, query in queries.items():
        if name not in waiting and not query.isActive:
            error = query.exception()
            if error is not None:
                return name, str(error)
    return None


def lease_problem(guards: Sequence[LeaseGuard]) -> tuple[str, str] | None:
    """(flow, why) of the first flow whose lease is no longer this run's; None: all are, or the
    lease store did not answer this time (ridden out: a lease not renewed for long enough is
    reported as such once the store answers again)."""
    for guard in guards:
        try:
            guard.check()
        except LeaseLostError as exc:
            return guard.flow, str(exc)
        except OSError:  # the store (a disk, S3) failed one read: ask again next time
            continue
    return None


def lease_taken(guards: Sequence[LeaseGuard]) -> tuple[str, str] | None:
    """(flow, why) of the first flow whose lease another owner now holds, or which was released:
    what makes a query of this run fail by itself (its commit refused). A lease only close to
    expiry is not enough to blame for a failure (the failure may have its own cause)."""
    for guard in guards:
        try:
            term = guard.store.latest()
        except OSError:
            continue
        if term is None or term.owner != guard.owner or term.released:
            return lease_problem([guard])
    return None


@dataclass(frozen=True)
class Ending:
    """How a run's supervision ended: the exit code, and why each flow of the run stopped."""

    code: int
    stops: tuple[FlowStopped, ...]

    @classmethod
    def every(
        cls, code: int, flows: Iterable[str], reason: StopReason, message: str = ""
    ) -> Ending:
        """Every flow of the run stopped for one reason (finished, stopped on request)."""
        return cls(code, tuple(FlowStopped(flow, reason, message) for flow in sorted(flows)))

    @classmethod
    def failed(cls, code: int, flows: Iterable[str], cause: FlowStopped) -> Ending:
        """``cause`` stopped its flow; the run's other flows were stopped because of it."""
        others = StopReason.OTHER_FLOW_FAILED
        return cls(
            code,
            tuple(
                cause
                if flow == cause.flow
                else replace(cause, flow=flow, reason=others, expectations=())
                for flow in sorted({*flows, cause.flow})
            ),
        )


def supervise(
    queries: dict[str, StreamingQuery],
    stop: StopRequest,
    reporter: Reporter,
    guards: Sequence[LeaseGuard] = (),
    phases: Phases | None = None,
    failures: BatchFailures | None = None,
    outages: SourceOutages | None = None,
) -> Ending:
    """Wait until the queries end, fail, lose a lease, or a stop is requested; say how it ended.

    With ``phases``, the queries of later phases are started (and added to ``queries``) as the
    earlier ones end. "All ended" is read before the failures: a query that ends is inactive with
    its exception already set, so a failure between the two reads cannot pass for a clean end.
    ``failures``: what the flows' batches raised, which says why a query failed. ``outages``:
    a query whose source stopped answering waits for it and starts again (module doc there).
    """
    waiting: Collection[str] = outages.waiting if outages is not None else ()  # kept current
    while True:
        if phases is not None and not stop.requested:
            _started(phases.advance(queries, waiting), queries, phases, reporter)
        flows = {flow_of_query(name) for name in queries} | set(phases.pipelines if phases else ())
        if outages is not None and not stop.requested:
            restarted, gave_up = outages.tick()
            if phases is not None:
                _started(restarted, queries, phases, reporter)
            else:
                queries.update(restarted)
            if gave_up is not None:
                stop_after_inflight_batches(q for q in queries.values() if q.isActive)
                return Ending.failed(EXIT_FAILED, flows, gave_up)
        all_ended = (
            all(not q.isActive for q in queries.values())
            and not waiting
            and (phases is None or phases.done or stop.requested)
        )
        failure = first_failure(queries, waiting)
        if failure is not None:
            lost = lease_taken(guards)
            if lost is not None:  # e.g. a commit refused because the new owner made it first
                return _lease_lost(queries, lost, reporter, flows, failure)
            cause = _cause(queries, failure, failures)
            name = failure[0]  # once a stop is requested, nothing waits: the run ends
            if (
                outages is not None
                and not stop.requested
                and outages.begins(name, queries[name], cause)
            ):
                continue
            return _failed(queries, cause, reporter, flows)
        if all_ended:  # a stop request may end a run before its later phases start
            pending = stop.requested and phases is not None and not phases.done
            reason = StopReason.STOPPED_ON_REQUEST if pending else StopReason.FINISHED
            return Ending.every(EXIT_OK, flows, reason, stop.reason if pending else "")
        lost = lease_problem(guards)
        if lost is not None:
            return _lease_lost(queries, lost, reporter, flows)
        if stop.requested:
            reporter.info(f"stopping gracefully ({stop.reason}) after the in-flight batches commit")
            stop_after_inflight_batches(queries.values())
            return Ending.every(EXIT_OK, flows, StopReason.STOPPED_ON_REQUEST, stop.reason)
        time.sleep(POLL_SECONDS)


def _started(
    started: dict[str, StreamingQuery],
    queries: dict[str, StreamingQuery],
    phases: Phases,
    reporter: Reporter,
) -> None:
    """Queries that just started (a next phase, or again after an outage): said, and watched."""
    for name, query in started.items():
        reporter.info(f"started {name}")
        for stage in phases.started(name):
            reporter.started(stage)
        queries[name] = query


def _lease_lost(
    queries: dict[str, StreamingQuery],
    lost: tuple[str, str],
    reporter: Reporter,
    flows: set[str],
    failure: tuple[str, str] | None = None,
) -> Ending:
    """This run no longer holds a flow's lease: stop every query now. ``failure``: a query that
    failed after another owner took the lease over (a paused driver waking past its lease finds
    its commit already made by the new owner, and the store refuses it), reported with it."""
    flow, problem = lost
    message = f"stopping now, the in-flight batches uncommitted: {problem}"
    if failure is not None:
        name, error = failure
        print(f"conflux: the failure of {name} as Spark reported it:\n{error}", file=sys.stderr)
        first_line = error.strip().splitlines()[0] if error.strip() else "no message"
        message = f"{problem}; {name} failed meanwhile: {first_line[:300]}"
    reporter.error(message)
    for query in queries.values():
        query.stop()  # no waiting: the lease may pass to a new owner soon
    return Ending.failed(EXIT_LEASE, flows, FlowStopped(flow, StopReason.LEASE_LOST, message))


def _cause(
    queries: dict[str, StreamingQuery], failure: tuple[str, str], failures: BatchFailures | None
) -> FlowStopped:
    """Why a query failed (printing Spark's own account of it)."""
    name, error = failure
    print(f"conflux: the failure of {name} as Spark reported it:\n{error}", file=sys.stderr)
    raised = failures.of(name) if failures is not None else None
    return failure_stop(flow_of_query(name), name, raised, query_exception(queries[name]), error)


def _failed(
    queries: dict[str, StreamingQuery], cause: FlowStopped, reporter: Reporter, flows: set[str]
) -> Ending:
    """A query failed: report why, stop the others (at once when the lease is lost, else after
    their in-flight batches commit)."""
    reporter.error(cause.message)
    lease_lost = cause.reason is StopReason.LEASE_LOST
    active = [query for query in queries.values() if query.isActive]
    if lease_lost:
        for query in active:
            query.stop()  # no waiting: the lease may pass to a new owner soon
    else:
        stop_after_inflight_batches(active)
    return Ending.failed(EXIT_LEASE if lease_lost else EXIT_FAILED, flows, cause)


@contextmanager
def own_leases(specs: list[FlowSpec], settings: Settings) -> Iterator[str]:
    """Take every flow's lease for this process (it is its own launcher); yield the owner id."""
    owner = new_owner_id("runner")
    leases = [
        FlowLease(
            spec.name,
            FlowState.of(spec, settings).lease_store(),
            owner,
            owner_details(launcher=IN_PROCESS_LAUNCHER),
            settings.lease_seconds,
        )
        for spec in specs
    ]
    with held_leases(leases):
        yield owner


def run_flows(
    specs: list[FlowSpec],
    settings: Settings,
    reporter: Reporter,
    stop: StopRequest,
    trigger_mode: str | None = None,
    spark: SparkSession | None = None,
    lease_owner: str | None = None,
    full_refresh: bool = False,
) -> int:
    """Run ``specs`` in one Spark application and report their progress; return the exit code.

    ``lease_owner``: the launcher that holds (and renews) the flows' leases; None takes them here.
    ``full_refresh``: rebuild the flows' silver tables from bronze and swap them in at the end
    (:mod:`pipelines.silver.refresh`); an incremental (``available_now``) run only.

    Raises:
        LeaseHeldError / LeaseLostError: the leases are not this run's (before Spark starts).
        ConfigError: a spec or a flow's identity is invalid.
    """
    check_locations(specs, settings)
    if full_refresh:
        continuous = [s.name for s in specs if (trigger_mode or s.trigger.mode) != "available_now"]
        if continuous:
            raise ConfigError(
                f"flows {', '.join(continuous)}: a full refresh is an incremental run: run it "
                "with trigger available_now (`conflux refresh FLOW` does), then start the "
                "continuous run again"
            )
    run = partial(
        _run_owned, specs, settings, reporter, stop, trigger_mode, spark, full_refresh=full_refresh
    )
    if lease_owner is None:
        with own_leases(specs, settings) as owner:
            return run(owner)
    return run(lease_owner)


def _run_owned(
    specs: list[FlowSpec],
    settings: Settings,
    reporter: Reporter,
    stop: StopRequest,
    trigger_mode: str | None,
    spark: SparkSession | None,
    owner: str,
    full_refresh: bool = False,
) -> int:
    locations = {s.name: FlowState.of(s, settings) for s in specs}
    guards = {name: LeaseGuard(name, loc.lease_store(), owner) for name, loc in locations.items()}
    for guard in guards.values():
        guard.check()  # before Spark starts
    for loc in locations.values():
        stop.watch(loc.stop_file(owner))
    reporter.track_status({n: loc.status_file for n, loc in locations.items()}, owner=owner)
    own_session = spark is None
    spark = spark or get_spark_session("conflux-" + "-".join(s.name for s in specs), settings)
    heartbeat = HeartbeatWriter({n: loc.health_file for n, loc in locations.items()}, owner)
    tracker = ProgressTracker(reporter, heartbeat, spark)
    for spec in specs:
        for write in resume_swap(spark, spec, settings):  # a crash cut a full refresh's swap
            reporter.info(f"flow {spec.name}: finished swapping in {write.table}")
    pipelines = [
        FlowPipeline(spec, settings, guards[spec.name], tracker, full_refresh) for spec in specs
    ]
    spark.streams.addListener(tracker)
    ending = Ending(EXIT_OK, ())
    try:
        for pipeline in readers_last(pipelines):  # every flow's tables before any query starts
            pipeline.prepare(spark)
        phases = Phases(pipelines, spark, trigger_mode)
        queries = phases.start_first()
        reporter.info(f"started flows {', '.join(queries)} (lease owner {owner})")
        for started in (s for name in queries for s in phases.started(name)):
            reporter.started(started)
        outages = SourceOutages({s.name: s for s in specs}, settings, reporter, phases.restart)
        ending = supervise(
            queries, stop, reporter, list(guards.values()), phases, tracker.failures, outages
        )
        for name, query in queries.items():
            tracker.wait_for_batch(name, last_batch_id(query))  # its commit's report is async
        wait_for_background_work()  # before finish() swaps tables they may still read
        if ending.code == EXIT_OK and not stop.requested:
            for pipeline in pipelines:
                for write in pipeline.finish(spark):
                    reporter.info(
                        f"flow {pipeline.spec.name}: swapped in the rebuilt {write.role} table "
                        f"{write.table} (version {write.version})"
                    )
    finally:
        spark.streams.removeListener(tracker)
        heartbeat.stopped()
        wait_for_background_work()
        if own_session:  # before Python exits, so no listener event is sent to a dead driver
            if report := executors_report(spark):
                reporter.info(report)
            spark.stop()
    if ending.code == EXIT_OK:
        reporter.finished([t.summary() for t in tracker.totals.values()])
    for stopped in ending.stops:
        reporter.stopped(replace(stopped, exit_code=ending.code))
    return ending.code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run Conflux flows into bronze Delta tables.")
    parser.add_argument("--spec", action="append", required=True, type=Path, help="flow spec YAML")
    parser.add_argument("--trigger", choices=TRIGGER_MODES, help="override the specs' trigger mode")
    parser.add_argument("--stop-file", type=Path, help="stop gracefully when this file appears")
    parser.add_argument(
        "--full-refresh",
        action="store_true",
        help="rebuild the flows' silver tables from bronze, then swap them in",
    )
    parser.add_argument(
        "--lease-owner",
        help="the launcher holding the flows' leases (default: this process takes them)",
    )
    return parser.parse_args(argv)


def not_started(
    reporter: Reporter, flows: Sequence[str], exc: BaseException, message: str, code: int
) -> int:
    """Report that ``flows`` did not run (or stopped outside supervision), and why; return the
    exit code."""
    reporter.error(message)
    for flow in flows:
        try:
            reporter.stopped(FlowStopped(flow, stop_reason(exc), message, exit_code=code))
        except OSError as failed:  # its status file is on the full disk: the error above says why
            reporter.error(f"flow {flow}: its stop could not be recorded: {failed}")
    return code


def flows_that_ran(specs: Sequence[FlowSpec], settings: Settings | None) -> set[str]:
    """The flows whose bronze checkpoint planned a batch, in this run or an earlier one: a
    failure of theirs is no failure to start (a full disk two minutes in). One whose checkpoint
    cannot be read counts as run, so nothing claims it never started; without settings, the
    run never began (nothing ran)."""
    ran: set[str] = set()
    if settings is None:
        return ran
    for spec in specs:
        try:
            if checkpoint_has_offsets(FlowState.of(spec, settings).checkpoint):
                ran.add(spec.name)
        except (OSError, ConfigError):
            ran.add(spec.name)
    return ran


def failure_message(flows: Sequence[str], ran: Collection[str], exc: BaseException) -> str:
    """What a run that failed outside the queries' supervision says: ``failed to start`` of
    the flows that never ran (:func:`flows_that_ran`), ``failed`` of the others; a full disk is
    named by its volume (:func:`pipelines.stops.disk_full`), anything else as raised."""
    full = disk_full(exc)
    cause = full.describe() if full is not None else str(exc)
    started = [flow for flow in flows if flow in ran]
    never = [flow for flow in flows if flow not in ran]
    said = [
        f"flows {', '.join(group)} {verb}"
        for group, verb in ((started, "failed"), (never, "failed to start"))
        if group
    ]
    return f"{' and '.join(said)}: {cause}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = StopRequest(Location.local(args.stop_file) if args.stop_file else None)
    stop.install_signal_handlers()
    flows = [p.stem for p in args.spec]  # their names, once the specs load
    specs: list[FlowSpec] = []
    settings: Settings | None = None  # known: the run may have begun (flows_that_ran)
    with ExitStack() as stack:
        reporter = open_reporter(stack)
        try:
            specs = [load_spec(p) for p in args.spec]
            flows = [spec.name for spec in specs]
            settings = load_settings()
            if args.lease_owner is not None:  # the launcher holds the leases: an end before the
                # flows start (a refused spec, a Spark that never came up) is theirs to record
                status_files = {s.name: FlowState.of(s, settings).status_file for s in specs}
                reporter.track_status(status_files, owner=args.lease_owner)
            code = run_flows(
                specs,
                settings,
                reporter,
                stop,
                args.trigger,
                lease_owner=args.lease_owner,
                full_refresh=args.full_refresh,
            )
        except (LeaseHeldError, LeaseLostError) as exc:
            raise SystemExit(not_started(reporter, flows, exc, str(exc), EXIT_LEASE)) from exc
        except ConfigError as exc:
            raise SystemExit(not_started(reporter, flows, exc, str(exc), EXIT_CONFIG)) from exc
        except Exception as exc:  # a Spark error while a query starts, a full disk later...
            message = failure_message(flows, flows_that_ran(specs, settings), exc)
            raise SystemExit(not_started(reporter, flows, exc, message, EXIT_FAILED)) from exc
        if code != EXIT_OK:
            raise SystemExit(code)  # under Pipes, closing the context reports the failure
    return code


if __name__ == "__main__":
    sys.exit(main())

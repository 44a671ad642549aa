"""``conflux``: validate, list, inspect, run, stop, reset, refresh, maintain and backfill flows
from a terminal.

Every command works on the flows folder of the settings (``CONFLUX_FLOWS_DIR``, default
``flows/``) and talks to running flows only through their files: the lease (who runs it), the
status file (its last committed batch) and the stop channel. So ``conflux stop`` stops a flow
whoever launched it (Dagster, another terminal), after its in-flight batch commits.

Exit codes: 0 ok, 1 the flow failed, 2 misconfiguration, 3 the flow is owned by another run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, date, datetime
from types import FrameType

from pipelines.catalog.state import FlowState
from pipelines.catalog.tables import FlowCatalog, check_distinct_tables
from pipelines.errors import ConfigError
from pipelines.identity import read_identity, reset_flow
from pipelines.launcher import FlowApplication
from pipelines.lease import LeaseHeldError, LeaseTerm
from pipelines.location import Location
from pipelines.messages import BatchCommitted
from pipelines.reporting import PROGRESS_PREFIX
from pipelines.run_state import Phase, flow_run_state
from pipelines.runner import EXIT_CONFIG, EXIT_LEASE
from pipelines.settings import Settings, load_settings
from pipelines.spec import (
    FlowSpec,
    SpecError,
    SpecProblem,
    check_specs,
    json_schema,
    load_specs,
)
from pipelines.status import read_status
from pipelines.stopping import ask_to_stop, requester
from pipelines.storage import StorageError
from pipelines.supervisor import Attempt, Supervisor


def _specs(settings: Settings) -> list[FlowSpec]:
    specs = load_specs(settings.flows_dir)
    check_distinct_tables(specs, settings)
    return specs


def _spec(settings: Settings, name: str) -> FlowSpec:
    specs = {spec.name: spec for spec in _specs(settings)}
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"no flow named {name!r} in {settings.flows_dir} (flows: {known})")
    return specs[name]


def _lease(spec: FlowSpec, settings: Settings) -> LeaseTerm | None:
    return FlowState.of(spec, settings).lease_store().latest()


def cmd_validate(settings: Settings, _args: argparse.Namespace) -> int:
    """Check every spec of the flows folder, each on its own and together, and list every
    problem (a line each, naming the file, the field and the fix; the other commands stop at the
    first), then the stores the valid flows use. Exit 2 when anything is wrong."""
    check = check_specs(settings.flows_dir)
    problems = [*check.problems, *_location_problems(check.specs, settings)]
    bad = {problem.file for problem in problems}
    by_file = {spec.spec_file: spec for spec in check.specs}
    for file in check.files:
        if file not in bad:
            print(f"ok  {by_file[file].name:24} {file}")
        for problem in (p for p in problems if p.file == file):
            print(f"conflux: error: {problem}", file=sys.stderr)
    valid = [spec for spec in check.specs if spec.spec_file not in bad]
    print(f"{len(valid)} flow(s) valid in {settings.flows_dir}")
    if problems:
        print(
            f"conflux: {len(problems)} problem(s) in {len(bad)} of {len(check.files)} spec(s) "
            f"in {settings.flows_dir}",
            file=sys.stderr,
        )
    unreachable = 0
    for store in _stores(valid, settings):
        try:
            store.check_store()
        except (ConfigError, StorageError) as exc:  # it names the store and the fix
            print(f"conflux: error: {exc}", file=sys.stderr)
            unreachable += 1
        else:
            print(f"ok  {store.uri}: reachable, conditional writes honoured")
    return EXIT_CONFIG if problems or unreachable else 0


def _location_problems(specs: Sequence[FlowSpec], settings: Settings) -> list[SpecProblem]:
    """Tables of two specs (or two roles of one) at one location: each spec's against the specs
    before it, so every clash is named once."""
    problems: list[SpecProblem] = []
    placed: list[FlowSpec] = []
    for spec in specs:
        try:
            check_distinct_tables([*placed, spec], settings)
        except SpecError as exc:
            problems.append(SpecProblem(spec.spec_file, str(exc)))
            continue
        placed.append(spec)
    return problems


def _stores(specs: list[FlowSpec], settings: Settings) -> list[Location]:
    """One location per S3 bucket the flows keep tables or state in."""
    buckets: dict[str, Location] = {}
    for spec in specs:
        catalog = FlowCatalog.of(spec, settings)
        for location in [catalog.state.flow_dir, *(table.path for table in catalog)]:
            if not location.is_local:
                buckets.setdefault(location.uri.partition("://")[2].partition("/")[0], location)
    return [replace(loc, uri=loc.uri.partition("://")[0] + "://" + b) for b, loc in buckets.items()]


def cmd_flows(settings: Settings, _args: argparse.Namespace) -> int:
    print(f"{'flow':24} {'trigger':14} {'state':40} {'last batch':>10} {'lag':>8}")
    unreadable = 0
    for spec in _specs(settings):
        try:
            state = flow_run_state(spec, settings)
            last = read_status(spec, settings).last_batch
        except ConfigError as exc:  # one flow's damaged status file: the others still show
            print(f"{spec.name:24} {spec.trigger.mode:14} {'status file unreadable':40}")
            print(f"conflux: error: {exc}", file=sys.stderr)
            unreadable += 1
            continue
        batch_id = "-" if last is None else last.batch_id
        print(
            f"{spec.name:24} {spec.trigger.mode:14} {state.short:40} {batch_id!s:>10} "
            f"{state.lag_text():>8}"
        )
    return EXIT_CONFIG if unreadable else 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    spec = _spec(settings, args.flow)
    locations = FlowState.of(spec, settings)
    term = _lease(spec, settings)
    identity = read_identity(locations)
    last = read_status(spec, settings).last_batch
    now = time.time()
    state = flow_run_state(spec, settings, now=now)
    report = {
        "flow": spec.name,
        "state": state.short,
        "run": state.to_json(),
        "lease": None if term is None else term.describe(now),
        "table": str(locations.table),
        "checkpoint": str(locations.checkpoint),
        "generation": None if identity is None else identity.generation,
        # as the status file holds it (keys sorted at every level, as earlier versions printed it)
        "last_batch": None
        if last is None
        else json.loads(json.dumps(last.to_json(), sort_keys=True)),
        "health": None if state.health is None else state.health.metadata(),
        "stopped": None if state.stopped is None else state.stopped.to_json(),
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"flow        {spec.name} ({spec.spec_file})")
    print(f"state       {state.summary}")
    if term is not None:
        print(f"lease       {report['lease']}")
    print(f"table       {locations.table}  (checkpoint generation {report['generation']})")
    print(f"last batch  {'none yet' if last is None else batch_line(last)}")
    if last is not None and state.phase is Phase.RUNNING:
        for partition, lag in sorted((last.partition_lag or {}).items()):
            print(f"  lag {partition:30} {lag}")
    elif last is not None and last.lag is not None:
        print(f"lag         unknown: not running ({last.lag} when batch {last.batch_id} committed)")
    return 0


def batch_line(last: BatchCommitted) -> str:
    """A committed batch in one line: only figures it really has (no Delta version when it
    wrote none, no rate for a batch that read nothing)."""
    wrote = f"{last.rows_added} rows added"
    if last.replayed:
        wrote += " (a replay: Delta skipped its writes)"
    elif last.delta_version is not None:
        wrote += f" in Delta version {last.delta_version}"
    if last.input_rows:
        wrote += (
            f", {last.input_rows} rows read in {last.batch_duration_ms / 1000:.1f} s "
            f"({last.processed_rows_per_second:,.0f} rows/s)"
        )
    return f"{last.batch_id} of {last.flow} {last.stage} at {last.timestamp}: {wrote}"


class _ProgressBar:
    """Rows written so far, from the runner's progress lines (tqdm on a terminal)."""

    def __init__(self, flows: Sequence[str]) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            desc=", ".join(flows), unit=" rows", file=sys.stderr, disable=not sys.stderr.isatty()
        )
        self.rows = 0

    def line(self, text: str) -> None:
        if not text.startswith(PROGRESS_PREFIX):
            return
        batch = BatchCommitted.parse(json.loads(text[len(PROGRESS_PREFIX) :]))
        self.rows += batch.rows_added
        self._bar.update(batch.rows_added)
        self._bar.set_postfix(batch=batch.batch_id, lag=batch.lag)

    def close(self) -> None:
        self._bar.close()


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """Run the flows; a continuous run is supervised (:mod:`pipelines.supervisor`): a failed
    application starts again, an unreachable source is waited for."""
    specs = [_spec(settings, name) for name in dict.fromkeys(args.flows)]
    trigger = "continuous" if args.continuous else ("available_now" if args.once else None)

    def start() -> Attempt:
        application = FlowApplication(
            specs, settings, trigger=trigger, owner_kind="cli", stdout=subprocess.PIPE
        )
        return _attend(application, args.flows)

    if any((trigger or spec.trigger.mode) != "continuous" for spec in specs):
        return start().code
    asked = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        print(f"conflux: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
        asked.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        supervisor = Supervisor(specs, settings, wait=asked.wait)
        return supervisor.run(start, say=lambda text: print(f"conflux: {text}", flush=True))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_refresh(settings: Settings, args: argparse.Namespace) -> int:
    from pipelines.silver.refresh import abandon_refresh

    spec = _spec(settings, args.flow)
    if args.abandon:
        removed = abandon_refresh(spec, settings)
        for path in removed:
            print(f"removed {path}")
        print(f"flow {spec.name}: " + ("refresh dropped" if removed else "no refresh pending"))
        return 0
    application = FlowApplication(
        [spec],
        settings,
        trigger="available_now",
        runner_args=("--full-refresh",),
        owner_kind="cli",
        stdout=subprocess.PIPE,
    )
    return _attend(application, [spec.name]).code


def _attend(application: FlowApplication, flows: Sequence[str]) -> Attempt:
    """Run the application, relaying its output with a progress bar; Ctrl-C stops it."""
    interrupts = 0

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print(
                f"conflux: {signal.Signals(signum).name}: stopping after the in-flight batch "
                "commits (again to terminate now)",
                file=sys.stderr,
                flush=True,
            )
            application.request_stop(requester(f"{signal.Signals(signum).name} to conflux run"))
        elif application.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(application.process.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    bar = _ProgressBar([s.name for s in application.specs])
    try:
        with application:
            print(f"conflux: running {', '.join(flows)} as {application.owner}", flush=True)
            assert application.process is not None and application.process.stdout is not None
            for raw in application.process.stdout:
                text = raw.decode(errors="replace")
                bar.line(text)
                sys.stdout.write(text)
                sys.stdout.flush()
            returncode = application.wait()
            code = returncode if returncode >= 0 else 128 - returncode  # killed by a signal
    except LeaseHeldError as exc:
        print(f"conflux: {exc}", file=sys.stderr)
        return Attempt(EXIT_LEASE, application.owner, interrupts > 0)
    finally:
        bar.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"conflux: {', '.join(flows)} exited with code {code}; {bar.rows} rows written")
    return Attempt(code, application.owner, interrupts > 0)


def cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    spec = _spec(settings, args.flow)
    locations = FlowState.of(spec, settings)
    term = _lease(spec, settings)
    if term is None or not term.live():
        print(f"flow {spec.name} is not running")
        return 0
    ask_to_stop(locations.stop_file(term.owner), requester("conflux stop"))
    print(f"asked {term.owner} to stop flow {spec.name} after its in-flight batch commits")
    if args.no_wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        current = _lease(spec, settings)
        if current is None or current.owner != term.owner or not current.live():
            print(f"flow {spec.name} stopped")
            return 0
        time.sleep(0.5)
    print(f"flow {spec.name} still running after {args.timeout:.0f} s", file=sys.stderr)
    return 1


def cmd_reset(settings: Settings, args: argparse.Namespace) -> int:
    spec = _spec(settings, args.flow)
    if args.stage is not None:
        from pipelines.catalog.lifecycle import reset_stage

        moved = reset_stage(spec, settings, args.stage)
        for what, where in moved:
            print(f"moved {what} -> {where}")
        source = "bronze table" if args.stage == "silver" else "silver events table"
        print(
            f"flow {spec.name}: the {args.stage} stage starts over; the next run reads the whole "
            f"{source} again into new {args.stage} tables ({len(moved)} folders moved aside, "
            "nothing deleted)"
        )
        return 0
    identity = reset_flow(spec, FlowState.of(spec, settings))
    print(
        f"flow {spec.name}: new checkpoint generation {identity.generation} (the old one is in "
        f"{FlowState.of(spec, settings).archive_dir}); the next run reads the source from its "
        f"starting_offsets and takes over {identity.table_path} "
        f"({datetime.now(UTC).isoformat(timespec='seconds')})"
    )
    return 0


def cmd_maintain(settings: Settings, args: argparse.Namespace) -> int:
    """OPTIMIZE and VACUUM the flow's tables in a Spark session of its own (beside a running flow)."""
    from pyspark.sql import SparkSession

    from pipelines.maintenance import maintain_flow
    from pipelines.spark import get_spark_session

    spec = _spec(settings, args.flow)
    optimize = False if args.no_optimize else None
    vacuum = False if args.no_vacuum else None
    owned = SparkSession.getActiveSession() is None
    spark = get_spark_session(f"conflux-maintain-{spec.name}", settings, ui=False)
    try:
        reports = maintain_flow(spark, spec, settings, optimize=optimize, vacuum=vacuum)
    finally:
        if owned:
            spark.stop()
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
    else:
        for report in reports:
            print(report.summary())
        if not reports:
            print(f"flow {spec.name} has no table yet: nothing to maintain")
    failed = [r.table for r in reports if not r.ok]
    if failed:
        print(
            f"conflux: maintenance of flow {spec.name} failed for {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_backfill(settings: Settings, args: argparse.Namespace) -> int:
    """Recompute event dates of a gold table from the silver events (late rows included)."""
    from pyspark.sql import SparkSession

    from pipelines.gold.backfill import backfill, refuse_open_dates
    from pipelines.job_progress import JobProgress, progress_every, terminal_bar
    from pipelines.spark import get_spark_session

    spec = _spec(settings, args.flow)
    table = args.table or (spec.gold[0].table if len(spec.gold) == 1 else None)
    if table is None:
        tables = ", ".join(g.table for g in spec.gold) or "none"
        raise ConfigError(f"flow {spec.name}: name the gold table with --table ({tables})")
    first, last = date.fromisoformat(args.first), date.fromisoformat(args.last or args.first)
    refuse_open_dates(spec, settings, table, first, last)  # before Spark starts
    owned = SparkSession.getActiveSession() is None
    spark = get_spark_session(f"conflux-backfill-{spec.name}", settings, ui=False)
    try:
        label = f"backfill {table} {first}..{last}"
        with JobProgress(spark, label, terminal_bar(), every=progress_every()):
            result = backfill(spark, spec, settings, table, first, last)
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # end the progress bar's line
        if owned:
            spark.stop()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(
            f"flow {spec.name}: gold {table} {first}..{last} recomputed from the silver events: "
            f"{result.gold_rows} rows"
            + (
                f" reflecting {result.rows_reflected} events"
                if result.rows_reflected != result.gold_rows
                else ""
            )
            + ", "
            f"{result.late_rows_covered} late rows reconciled (backfill {result.backfill_id}, "
            f"version {result.gold_version}; closed until {result.closed_until})"
        )
    return 0


def cmd_catalog(settings: Settings, args: argparse.Namespace) -> int:
    """Every table and piece of state the flow owns, as the catalog derives them: what runs,
    resets, refreshes, maintenance and the Dagster assets all read."""
    spec = _spec(settings, args.flow)
    catalog = FlowCatalog.of(spec, settings)
    identity = read_identity(catalog.state)
    tables = [
        {
            "id": table.id,
            "layer": table.layer.value,
            "name": table.name,
            "location": table.location,
            "exists": (table.path / "_delta_log").exists(),
            "written_by": table.writer,
            "asset_key": "/".join(table.asset_key_path) if table.asset_key_path else None,
            "txn_app_id": None
            if identity is None or table.writer is None
            else table.app_id(identity),
        }
        for table in catalog
    ]
    state = catalog.state
    checkpoints = {stage: str(path) for stage, path in catalog.query_checkpoints().items()}
    files = {
        "identity": state.identity_file,
        "lease": state.lease_dir,
        "stop channel": state.control_dir,
        "status": state.status_file,
        "health": state.health_file,
        "archive": state.archive_dir,
    }
    if args.json:
        state_files = {k: str(v) for k, v in files.items()}
        print(json.dumps({"flow": spec.name, "tables": tables, "checkpoints": checkpoints,
                          "state": state_files}, indent=2))  # fmt: skip
        return 0
    print(f"flow {spec.name} ({spec.spec_file}): {len(tables)} tables, state in {state.flow_dir}")
    for row in tables:
        asset = row["asset_key"] or "(side table)"
        print(
            f"  {row['id']:30} {row['layer']:6} {asset:40} "
            f"{'' if row['exists'] else '(not created yet) '}{row['location']}"
        )
    print("checkpoints")
    for stage, checkpoint in checkpoints.items():
        print(f"  {stage:30} {checkpoint}")
    for what, path in files.items():
        print(f"{what:32} {path}")
    return 0


def cmd_schema(_settings: Settings, _args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="conflux", description=__doc__.split("\n")[0])
    commands = main.add_subparsers(dest="command", required=True)
    commands.add_parser("validate", help="validate every flow spec").set_defaults(func=cmd_validate)
    commands.add_parser("flows", help="list the flows and their state").set_defaults(func=cmd_flows)
    status = commands.add_parser("status", help="lease owner, last batch, lag per partition")
    status.add_argument("flow")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    catalog = commands.add_parser(
        "catalog", help="every table and piece of state a flow owns, and where it lives"
    )
    catalog.add_argument("flow")
    catalog.add_argument("--json", action="store_true", help="machine-readable output")
    catalog.set_defaults(func=cmd_catalog)
    run = commands.add_parser("run", help="run flows in one Spark application (Ctrl-C stops)")
    run.add_argument("flows", nargs="+", metavar="FLOW")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--continuous", action="store_true", help="run until stopped")
    mode.add_argument("--once", action="store_true", help="catch up, then exit (available_now)")
    run.set_defaults(func=cmd_run)
    stop = commands.add_parser("stop", help="stop a running flow after its in-flight batch")
    stop.add_argument("flow")
    stop.add_argument("--no-wait", action="store_true", help="do not wait for it to stop")
    stop.add_argument("--timeout", type=float, default=180.0, help="seconds to wait (180)")
    stop.set_defaults(func=cmd_stop)
    reset = commands.add_parser(
        "reset", help="start a new checkpoint generation (re-reads the source)"
    )
    reset.add_argument("flow")
    reset.add_argument(
        "--stage",
        choices=["silver", "gold"],
        help="only this stage (silver: gold too): move its tables and checkpoints aside; the "
        "next run rebuilds them from bronze (silver) or the silver events (gold)",
    )
    reset.set_defaults(func=cmd_reset)
    refresh = commands.add_parser(
        "refresh",
        help="rebuild a flow's silver tables from bronze, then swap them in (one incremental run)",
    )
    refresh.add_argument("flow")
    refresh.add_argument(
        "--abandon", action="store_true", help="drop a refresh still building (live tables stay)"
    )
    refresh.set_defaults(func=cmd_refresh)
    maintain = commands.add_parser(
        "maintain", help="OPTIMIZE and VACUUM a flow's tables (as its spec's maintenance says)"
    )
    maintain.add_argument("flow")
    maintain.add_argument("--no-optimize", action="store_true", help="skip OPTIMIZE")
    maintain.add_argument("--no-vacuum", action="store_true", help="skip VACUUM")
    maintain.add_argument("--json", action="store_true", help="machine-readable output")
    maintain.set_defaults(func=cmd_maintain)
    backfill = commands.add_parser(
        "backfill",
        help="recompute closed event dates of a gold table from the silver events (late rows too)",
    )
    backfill.add_argument("flow")
    backfill.add_argument("--table", help="the gold table (default: the flow's only one)")
    backfill.add_argument("--from", dest="first", required=True, help="first date, YYYY-MM-DD")
    backfill.add_argument("--to", dest="last", help="last date (default: --from)")
    backfill.add_argument("--json", action="store_true", help="machine-readable output")
    backfill.set_defaults(func=cmd_backfill)
    commands.add_parser(
        "schema", help="print the JSON Schema of flow specs (flows/flow.schema.json)"
    ).set_defaults(func=cmd_schema)
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(load_settings(), args))
    except LeaseHeldError as exc:
        print(f"conflux: {exc}", file=sys.stderr)
        return EXIT_LEASE
    except (ConfigError, StorageError) as exc:  # a store it cannot reach is a setting to fix
        print(f"conflux: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())

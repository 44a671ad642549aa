"""Conflux benchmarks: broker start, Spark session start, bronze throughput, end-to-end latency,
silver's freshness as the rate rises and its MERGE throughput at 10M keys (issue 25's targets);
on request (``--only``) reads before / after OPTIMIZE, and
the local disk against an S3 store (``store``: the benchmark's own s3proxy on loopback; and
``silver_store``: silver's produce → visible latency on each), and local mode against the
project's Spark cluster (``cluster``: bronze throughput at the ``--store-*`` sizes, silver at
``--silver-pace``, and where the tasks' time goes).

Usage (from the project root)::

    .venv/bin/python bench/run.py [--records N] [--only NAME ...] [--json out.json]

Everything runs in a temporary runtime folder with the benchmark's own Kafka broker (started
through ``platform/kafka/broker.py``, listening on 127.0.0.1 only); the broker, every Spark process
and the folder are removed at the end, also on errors. Results are printed as Markdown rows while
they come, then as one Markdown block with the machine facts and versions.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchmarks_md import write as write_benchmarks
from bench.cluster import ClusterPlan, run_cluster
from bench.harness import PROJECT_ROOT, WORKDIR_PREFIX, BenchError, Outcome, say
from bench.join import Plan as JoinPlan
from bench.join import run_gold_join
from bench.latency import LATENCY_RUNNERS, run_latency
from bench.latency import Plan as LatencyPlan
from bench.machine import load_average, machine_facts, versions
from bench.merge import SHAPES, parse_conf, plan_of, run_merge_throughput
from bench.optimize import Plan, run_optimize_reads
from bench.orders import Pace
from bench.own_broker import broker_outcome, start_broker, stop_broker
from bench.report import RESULTS_HEADER, document, markdown_block, write_json
from bench.rules import Plan as RulesPlan
from bench.rules import run_rules_throughput
from bench.session_start import run_session_start
from bench.silver_latency import (
    HAND_WRITTEN,
    HAND_WRITTEN_EXACTLY_ONCE,
    run_silver_latency,
    run_silver_store,
)
from bench.stateful import Plan as StatefulPlan
from bench.stateful import run_gold_stateful
from bench.store import StorePlan, run_store
from bench.throughput import RUNNERS, Setup, run_throughput
from pipelines.settings import load_settings

BENCHMARKS = (
    "broker_start",
    "spark_session_start",
    "bronze_throughput",
    "e2e_latency",
    "merge_throughput",
    "silver_latency",
    "optimize_reads",
    "rules_throughput",
    "gold_stateful",
    "gold_join",
    "store",
    "silver_store",
    "cluster",
)
#: Run only when named with --only (long, and about silver rather than the bronze baseline).
ON_REQUEST = {
    "optimize_reads",
    "rules_throughput",
    "gold_stateful",
    "gold_join",
    "store",  # ~8 minutes at the default size
    "silver_store",  # ~6 minutes at the default size
    "cluster",  # ~10 minutes at the default size
}
NEEDS_BROKER = {
    "broker_start",
    "bronze_throughput",
    "e2e_latency",
    "silver_latency",
    "store",
    "silver_store",
    "cluster",
}


#: What --quick changes (options given on the command line win).
QUICK: dict[str, Any] = {
    "records": [3_000],
    "repeats": 1,
    "commit_records": 1_500,
    "session_runs": 1,
    "latency_seconds": 5.0,
    "latency_warmup": 2.0,
    "latency_rates": [500.0, 2_000.0],
    "latency_table_rows": 5_000,
    "store_records": 20_000,
    "store_commit_records": 5_000,
    "store_pace": [500.0, 5.0],
    "store_table_rows": 5_000,
    "store_appends": 5,
    "store_renews": 20,
    "silver_rates": [500.0],
    "silver_seconds": 5.0,
    "silver_warmup": 2.0,
    "merge_keys": [20_000],
    "merge_batch": [4_000],
    "merge_batches": 2,
    "merge_history_keys": [10_000],
    "merge_history_batch": 4_000,
    "merge_optimize_every": 2,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the Conflux benchmarks.")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3,000 records once per runner, short latency phases (checks results, "
        "not speed)",
    )
    parser.add_argument(
        "--records",
        type=int,
        nargs="+",
        default=[1_000_000, 10_000_000],
        help="bronze_throughput: topic sizes, each read by every runner",
    )
    parser.add_argument(
        "--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS), help="bronze_throughput"
    )
    parser.add_argument(
        "--bootstrap", help="use this Kafka broker instead of starting the benchmark's own"
    )
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run only these benchmarks")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--commit-records",
        type=int,
        default=250_000,
        help="records per commit for every runner (Spark's maxOffsetsPerTrigger)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each throughput runner")
    parser.add_argument("--session-runs", type=int, default=3, help="Spark session start runs")
    parser.add_argument(
        "--latency-seconds", type=float, default=30.0, help="latency: seconds measured per rate"
    )
    parser.add_argument(
        "--latency-rates",
        type=float,
        nargs="+",
        default=[500.0, 5_000.0, 20_000.0],
        help="e2e_latency: events/s, one after the other",
    )
    parser.add_argument(
        "--latency-table-rows",
        type=int,
        default=1_000_000,
        help="e2e_latency: rows in the table before the rates are measured",
    )
    parser.add_argument(
        "--latency-runners",
        nargs="+",
        choices=LATENCY_RUNNERS,
        default=list(LATENCY_RUNNERS),
        help="e2e_latency: runners",
    )
    parser.add_argument(
        "--latency-interval-ms",
        type=int,
        default=500,
        help="e2e_latency: Conflux's trigger interval; the delta-rs writer's longest wait",
    )
    parser.add_argument(
        "--silver-pace",
        type=float,
        nargs=2,
        default=[500.0, 60.0],
        metavar=("RATE", "SECONDS"),
        help="silver_latency, cluster: events/s and seconds measured",
    )
    parser.add_argument(
        "--latency-warmup",
        type=float,
        default=10.0,
        help="latency: seconds produced at the same rate before measuring (excluded)",
    )
    parser.add_argument(
        "--merge-keys",
        type=int,
        nargs="+",
        default=[10_000_000],
        help="merge_throughput: live keys in the current table before the batches",
    )
    parser.add_argument(
        "--merge-batch",
        type=int,
        nargs="+",
        default=[500_000, 1_500_000],
        help="merge_throughput: change events per batch (20%% inserts of new keys, 80%% updates "
        "of existing keys, --merge-changes-per-key each)",
    )
    parser.add_argument("--merge-batches", type=int, default=20, help="merge_throughput: batches")
    parser.add_argument(
        "--merge-dv",
        choices=("off", "on", "both"),
        default="on",
        help="merge_throughput: deletion vectors on the current table (on: the stage's default)",
    )
    parser.add_argument(
        "--merge-table",
        choices=("current", "history", "both"),
        default="current",
        help="merge_throughput: MERGE into a current-state (SCD1) or a history (SCD2) table",
    )
    parser.add_argument(
        "--merge-shape",
        nargs="+",
        choices=SHAPES,
        default=list(SHAPES),
        help="merge_throughput: updated keys spread over all keys, or 80%% of them on the 10%% "
        "most recently inserted",
    )
    parser.add_argument(
        "--merge-changes-per-key",
        type=int,
        default=2,
        help="merge_throughput: changes of each updated key within a batch",
    )
    parser.add_argument(
        "--merge-history-keys",
        type=int,
        nargs="*",
        default=[1_000_000],
        help="merge_throughput: key counts at which a history table and a current table are "
        "measured on the same batches (uniform shape, --merge-history-batch changes each)",
    )
    parser.add_argument(
        "--merge-history-batch",
        type=int,
        default=100_000,
        help="merge_throughput: change events per batch of the --merge-history-keys tables",
    )
    parser.add_argument(
        "--merge-optimize-every",
        type=int,
        default=10,
        help="merge_throughput: OPTIMIZE the table every N batches, timed (0: never)",
    )
    parser.add_argument(
        "--merge-conf",
        action="append",
        metavar="K=V[,K=V]",
        help="merge_throughput: a set of session confs to measure (repeat for several sets; "
        "an empty string is Conflux's defaults)",
    )
    parser.add_argument(
        "--silver-designs",
        nargs="+",
        choices=("stream", "bronze_batch", HAND_WRITTEN, HAND_WRITTEN_EXACTLY_ONCE),
        default=["bronze_batch", HAND_WRITTEN, HAND_WRITTEN_EXACTLY_ONCE],
        help="silver_latency: chaining designs (stream, the default chaining, was measured against "
        f"bronze_batch in bench/HISTORY.md), {HAND_WRITTEN}: the minimal MERGE job a user "
        f"writes by hand (bench/hand_written_cdc.py), the floor beside them, and "
        f"{HAND_WRITTEN_EXACTLY_ONCE}: that job with Conflux's bronze and events appends, every "
        "write carrying its batch's transaction id",
    )
    parser.add_argument(
        "--silver-store-design",
        choices=("stream", "bronze_batch"),
        default="stream",
        help="silver_store: the chaining design run on the local disk and on the S3 store "
        "(at --silver-pace, trigger the first of --silver-intervals)",
    )
    parser.add_argument(
        "--silver-rates",
        type=float,
        nargs="+",
        default=[500.0, 2_000.0, 5_000.0],
        help="silver_latency: change events/s, each measured for --silver-seconds",
    )
    parser.add_argument(
        "--silver-seconds",
        type=float,
        default=600.0,
        help="silver_latency: seconds measured per rate, after --silver-warmup",
    )
    parser.add_argument(
        "--silver-warmup", type=float, default=60.0, help="silver_latency: seconds not measured"
    )
    parser.add_argument(
        "--silver-history-rates",
        type=float,
        nargs="*",
        default=[500.0],
        help="silver_latency: rates of --silver-rates measured once more with a history table "
        "in the flow (its own latency too)",
    )
    parser.add_argument(
        "--silver-intervals",
        nargs="+",
        default=["500 milliseconds"],
        help="silver_latency: trigger intervals to measure (each with every design)",
    )
    parser.add_argument(
        "--optimize-batches",
        type=int,
        default=200,
        help="optimize_reads: MERGE batches that build the current table",
    )
    parser.add_argument(
        "--optimize-batch",
        type=int,
        default=1_000,
        help="optimize_reads: upserts per batch (the first inserts, then half updates, half new)",
    )
    parser.add_argument(
        "--optimize-reads", type=int, default=5, help="optimize_reads: reads of each kind measured"
    )
    parser.add_argument(
        "--optimize-dv",
        choices=("off", "on", "both"),
        default="on",
        help="optimize_reads: deletion vectors on the current table (on: the default of current "
        "tables; off: MERGE rewrites the files it touches, so few small files pile up)",
    )
    parser.add_argument(
        "--rules-records", type=int, default=500_000, help="rules_throughput: records per batch"
    )
    parser.add_argument(
        "--rules-repeats", type=int, default=3, help="rules_throughput: batches per variant"
    )
    parser.add_argument(
        "--gold-records", type=int, default=1_000_000, help="gold_stateful: events in all"
    )
    parser.add_argument(
        "--gold-keys", type=int, default=1_000_000, help="gold_stateful: distinct group keys"
    )
    parser.add_argument(
        "--gold-rounds", type=int, default=10, help="gold_stateful: appends, each run to its end"
    )
    parser.add_argument(
        "--join-orders", type=int, default=500_000, help="gold_join: orders (90 %% get paid)"
    )
    parser.add_argument(
        "--join-rounds", type=int, default=10, help="gold_join: appends, each run to its end"
    )
    add_store_arguments(parser)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--write-benchmarks",
        action="store_true",
        help="regenerate BENCHMARKS.md and bench/results/ (plots, JSON) from this run",
    )
    args = parser.parse_args(argv)
    if args.quick:
        if args.write_benchmarks:
            parser.error("--quick checks results, not speed: it cannot regenerate BENCHMARKS.md")
        for name, value in QUICK.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    store = parser.add_argument_group("store (local disk against the benchmark's own S3 store)")
    store.add_argument(
        "--store-records", type=int, default=200_000, help="bronze throughput: topic size"
    )
    store.add_argument(
        "--store-commit-records", type=int, default=50_000, help="bronze throughput: per commit"
    )
    store.add_argument("--store-repeats", type=int, default=1, help="bronze throughput: runs each")
    store.add_argument(
        "--store-pace",
        type=float,
        nargs=2,
        default=[500.0, 60.0],
        metavar=("RATE", "SECONDS"),
        help="produce → visible: events/s and seconds measured (after --latency-warmup)",
    )
    store.add_argument(
        "--store-table-rows", type=int, default=50_000, help="produce → visible: rows first"
    )
    store.add_argument("--store-appends", type=int, default=30, help="small Delta appends each")
    store.add_argument("--store-append-rows", type=int, default=5, help="rows per small append")
    store.add_argument("--store-renews", type=int, default=200, help="lease renews each")


class Bench:
    """Runs the selected benchmarks and prints each result row as soon as it is known."""

    def __init__(self, args: argparse.Namespace, workdir: Path, jars_dir: Path) -> None:
        self.args, self.workdir, self.jars_dir = args, workdir, jars_dir
        self.selected = set(args.only or (b for b in BENCHMARKS if b not in ON_REQUEST))
        self.outcomes: dict[str, Outcome] = {}

    def record(self, name: str, outcome: Outcome) -> None:
        self.outcomes[name] = outcome
        for row in outcome.rows:
            print(row.markdown(), flush=True)

    def run(self) -> None:
        print(RESULTS_HEADER, flush=True)
        if "spark_session_start" in self.selected:
            self.session_start()
        if "merge_throughput" in self.selected:
            self.merge()
        if "optimize_reads" in self.selected:
            self.optimize_reads()
        if "rules_throughput" in self.selected:
            plan = RulesPlan(self.args.rules_records, self.args.rules_repeats)
            self.record("rules_throughput", run_rules_throughput(self.workdir, self.jars_dir, plan))
        if "gold_stateful" in self.selected:
            a = self.args
            plan = StatefulPlan(a.gold_records, a.gold_keys, a.gold_rounds)
            self.record("gold_stateful", run_gold_stateful(self.workdir, self.jars_dir, plan))
        if "gold_join" in self.selected:
            join_plan = JoinPlan(self.args.join_orders, self.args.join_rounds)
            self.record("gold_join", run_gold_join(self.workdir, self.jars_dir, join_plan))
        if self.selected & NEEDS_BROKER:
            self.with_broker()

    def session_start(self) -> None:
        runs = self.args.session_runs
        self.record("spark_session_start", run_session_start(self.workdir, self.jars_dir, runs))

    def with_broker(self) -> None:
        if self.args.bootstrap:
            self.on_broker(self.args.bootstrap)
            return
        runtime = self.workdir / "broker"
        try:
            broker = start_broker(runtime, self.jars_dir)
            if "broker_start" in self.selected:
                self.record("broker_start", broker_outcome(broker))
            self.on_broker(broker.bootstrap)
        finally:
            stop_broker(runtime, self.jars_dir)

    def on_broker(self, bootstrap: str) -> None:
        if "bronze_throughput" in self.selected:
            self.throughput(bootstrap)
        if "e2e_latency" in self.selected:
            self.latency(bootstrap)
        if "silver_latency" in self.selected:
            self.silver_latency(bootstrap)
        if "store" in self.selected:
            self.store(bootstrap)
        if "silver_store" in self.selected:
            self.silver_store(bootstrap)
        if "cluster" in self.selected:
            self.cluster(bootstrap)

    def throughput(self, bootstrap: str) -> None:
        a = self.args
        workdir = self.workdir / "throughput"
        setup = Setup(workdir, self.jars_dir, bootstrap, a.commit_records, tuple(a.runners))
        self.record("bronze_throughput", run_throughput(setup, a.records, a.repeats))

    def latency(self, bootstrap: str) -> None:
        a = self.args
        plan = LatencyPlan(
            tuple(a.latency_rates), a.latency_seconds, a.latency_warmup,
            a.latency_interval_ms, a.latency_table_rows, tuple(a.latency_runners),
        )  # fmt: skip
        self.record("e2e_latency", run_latency(self.workdir, self.jars_dir, bootstrap, plan))

    def merge(self) -> None:
        a = self.args
        dv = {"off": [False], "on": [True], "both": [False, True]}[a.merge_dv]
        confs = [parse_conf([i for i in c.split(",") if i.strip()]) for c in a.merge_conf or [""]]
        tables = ("current", "history") if a.merge_table == "both" else (a.merge_table,)
        variants = plan_of(
            a.merge_keys, a.merge_batch, dv, confs, tables,
            tuple(a.merge_shape), a.merge_changes_per_key, a.merge_optimize_every,
        )  # fmt: skip
        paired = plan_of(
            a.merge_history_keys, [a.merge_history_batch], dv, confs, ("current", "history"),
            ("uniform",), a.merge_changes_per_key, a.merge_optimize_every,
        )  # fmt: skip
        variants += [v for v in paired if v not in variants]
        outcome = run_merge_throughput(self.workdir, self.jars_dir, variants, a.merge_batches)
        self.record("merge_throughput", outcome)

    def optimize_reads(self) -> None:
        a = self.args
        dv = {"off": (False,), "on": (True,), "both": (False, True)}[a.optimize_dv]
        plan = Plan(a.optimize_batches, a.optimize_batch, a.optimize_reads, dv)
        self.record("optimize_reads", run_optimize_reads(self.workdir, self.jars_dir, plan))

    def silver_latency(self, bootstrap: str) -> None:
        a = self.args
        outcome = run_silver_latency(
            self.workdir, self.jars_dir, bootstrap,
            [Pace(rate, a.silver_seconds, a.silver_warmup) for rate in a.silver_rates],
            a.silver_designs, a.silver_intervals, a.silver_history_rates,
        )  # fmt: skip
        self.record("silver_latency", outcome)

    def store(self, bootstrap: str) -> None:
        a = self.args
        plan = StorePlan(
            a.store_records, a.store_commit_records, a.store_repeats, a.store_pace[0],
            a.store_pace[1], a.latency_warmup, a.latency_interval_ms, a.store_table_rows,
            a.store_appends, a.store_append_rows, a.store_renews,
        )  # fmt: skip
        outcome = run_store(self.workdir, self.jars_dir, bootstrap, plan, command_line())
        self.record("store", outcome)

    def silver_store(self, bootstrap: str) -> None:
        a = self.args
        outcome = run_silver_store(
            self.workdir, self.jars_dir, bootstrap,
            Pace(a.silver_pace[0], a.silver_pace[1], a.latency_warmup),
            a.silver_store_design, a.silver_intervals[0], command_line(),
        )  # fmt: skip
        self.record("silver_store", outcome)

    def cluster(self, bootstrap: str) -> None:
        a = self.args
        plan = ClusterPlan(
            a.store_records, a.store_commit_records, a.store_repeats, a.silver_pace[0],
            a.silver_pace[1], a.latency_warmup, a.silver_intervals[0], a.silver_store_design,
        )  # fmt: skip
        outcome = run_cluster(self.workdir, self.jars_dir, bootstrap, plan, command_line())
        self.record("cluster", outcome)


def command_line() -> str:
    python = Path(sys.executable)
    if python.is_relative_to(PROJECT_ROOT):
        python = python.relative_to(PROJECT_ROOT)
    return shlex.join([str(python), "bench/run.py", *sys.argv[1:]])


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every cleanup


def run(args: argparse.Namespace, meta: dict[str, Any]) -> Bench:
    jars_dir = load_settings().jars_dir
    meta["versions"] = versions(jars_dir)
    workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    say(f"working folder {workdir}")
    bench = Bench(args, workdir, jars_dir)
    try:
        bench.run()
    finally:
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return bench


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "command": command_line(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
    }
    meta["machine"]["load average at start (1/5/15 min)"] = load_average()
    try:
        bench = run(args, meta)
    except BenchError as exc:
        say(f"FAILED: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted: everything it started was stopped")
        return 130
    meta["machine"]["load average at end (1/5/15 min)"] = load_average()
    meta["wall_seconds"] = time.monotonic() - started
    print("\n" + markdown_block(meta, bench.outcomes), flush=True)
    if args.json:
        write_json(args.json, meta, bench.outcomes)
    if args.write_benchmarks:
        write_benchmarks(document(meta, bench.outcomes), PROJECT_ROOT / "BENCHMARKS.md")
        say("wrote BENCHMARKS.md and bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

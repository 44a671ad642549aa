"""``cluster``: the same flows in local mode and on the project's Spark cluster, side by side.

The benchmark starts its own S3 store (``bench/own_store.py``) and its own Spark standalone
cluster (a master and two workers through ``platform/spark/cluster.py``, in its temporary folder)
and stops both at the end, also on errors. Both profiles keep the lake and the checkpoints on that
store (a cluster's executors share no disk with the driver); they differ only in the master:
``local[*]`` inside the driver's JVM, or ``spark://`` with one executor of one core on each worker
(the project cluster's defaults, ``pipelines/spark.py``). Measured on each, in one run:

1. bronze throughput: Conflux's bronze flow over the same topic (``bench/throughput.py``'s runner,
   availableNow), the order alternating per repetition;
2. silver: produce → visible in the current-state table at a steady rate, and the silver
   batches' busy throughput (``bench/silver_latency.py``'s run);
3. where the time goes: every task's metrics from the Spark event log of each run
   (:func:`task_times`): run time, deserialization, result serialization, scheduler delay, GC,
   shuffle bytes and the time spent waiting for them, the tasks' CPU (which the driver's process
   tree does not hold on a cluster) and how long the executors took to register.

On this 2-core machine a cluster cannot be faster: its executors and daemons share the cores the
driver uses, each task and its result cross a socket, and the driver still plans and commits
every batch. The figures say what the cluster path costs here (:data:`LABEL`), not what a cluster
of real machines would give.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.harness import PROJECT_ROOT, BenchError, Outcome, Row, median, say
from bench.orders import Pace
from bench.own_store import OwnStore, own_store, service_cli
from bench.report import side_by_side_rows, side_by_side_table
from bench.silver_latency import run_design
from bench.throughput import Setup, alternating_runs

PROFILES = ("local", "cluster")
CLUSTER_SCRIPT = PROJECT_ROOT / "platform" / "spark" / "cluster.py"
LABEL = "two workers on this 2-core machine, beside the driver: overhead, not speed-up"


@dataclass(frozen=True)
class ClusterPlan:
    records: int
    commit_records: int
    repeats: int
    rate: float
    seconds: float
    warmup: float
    interval: str
    design: str


@dataclass(frozen=True)
class Context:
    workdir: Path
    jars_dir: Path
    bootstrap: str
    store: OwnStore
    master_url: str

    def overrides(self, profile: str, prefix: str) -> dict[str, str]:
        """Settings fields of a run: the lake and checkpoints under ``prefix`` on the store, and
        on the cluster profile its master."""
        fields = self.store.settings(f"{profile}-{prefix}")
        return {**fields, "spark_master": self.master_url} if profile == "cluster" else fields

    def event_log(self, name: str) -> tuple[Path, dict[str, str]]:
        """A fresh folder for one run's Spark event log, and the settings that fill it."""
        folder = self.workdir / "events" / name
        folder.mkdir(parents=True)
        return folder, {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": folder.as_uri(),
            # one plain JSON-lines file: Spark 4 rolls and compresses event logs by default
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
        }


@contextlib.contextmanager
def own_cluster(runtime_dir: Path, jars_dir: Path) -> Iterator[dict[str, Any]]:
    """A running cluster for the ``with`` block (its state), stopped at its end, also on errors."""
    say(f"starting a Spark cluster (a master, two workers) in {runtime_dir}")
    try:
        result = service_cli(CLUSTER_SCRIPT, runtime_dir, jars_dir, "start", "--timeout", "120",
                             timeout=240)  # fmt: skip
        if result.returncode != 0:
            raise BenchError(f"Spark cluster start failed (exit {result.returncode}):\n"
                             f"{result.stderr}")  # fmt: skip
        state: dict[str, Any] = json.loads(result.stdout)
        if state.get("already_running"):
            raise BenchError(f"a cluster already ran in {runtime_dir}: not the benchmark's own")
        say(f"Spark cluster ready at {state['master_url']} in {state['ready_seconds']} s "
            f"(isolation {state['isolation']})")  # fmt: skip
        yield state
    finally:
        try:
            stopped = service_cli(CLUSTER_SCRIPT, runtime_dir, jars_dir, "stop", timeout=120)
            say(f"Spark cluster stop: exit {stopped.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            say(f"WARNING: stopping the Spark cluster failed: {exc}")


# --------------------------------------------------------------------------- task metrics


def task_times(folder: Path) -> dict[str, float]:
    """The metrics of every task that succeeded, from the one event log in ``folder``, summed
    (seconds, megabytes); the tasks that did not (failed, killed, lost with their executor) are
    counted apart, as the Spark UI's summary leaves them out. Also the number of executors (the
    driver counts as one in local mode) and how long after the application's start the last one
    registered.

    Raises:
        BenchError: no finished log (an ``.inprogress`` one means the driver never stopped
            cleanly: its sums would be partial), or a log without the application's start.
    """
    logs = [p for p in folder.iterdir() if p.is_file()]
    if len(logs) != 1 or logs[0].name.endswith(".inprogress"):
        raise BenchError(f"{folder}: expected one finished Spark event log, found "
                         f"{[p.name for p in logs]}")  # fmt: skip
    totals: Counter[str] = Counter({"tasks": 0, "failed_tasks": 0})
    started, executors = None, []
    with logs[0].open() as lines:
        for event in map(json.loads, lines):
            kind = event["Event"]
            if kind == "SparkListenerApplicationStart":
                started = event["Timestamp"]
            elif kind == "SparkListenerExecutorAdded":
                executors.append(event["Timestamp"])
            elif kind == "SparkListenerTaskEnd":
                if event.get("Task End Reason", {}).get("Reason") == "Success":
                    add_task(totals, event["Task Info"], event["Task Metrics"])
                else:
                    totals["failed_tasks"] += 1
    if started is None or not executors:
        raise BenchError(f"{logs[0]}: no application start or no executor in the event log")
    return {
        **{key: round(value, 3) for key, value in totals.items()},
        "executors": len(executors),
        "executors_ready_seconds": round((max(executors) - started) / 1000, 2),
    }


def add_task(totals: Counter[str], info: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Add one task's times (ms and ns in the log) in seconds, and its shuffle bytes in MB.

    The scheduler delay is what the Spark UI calls it: the task's time from launch to finish
    that is neither deserializing, running, serializing its result nor sending it back."""
    duration = info["Finish Time"] - info["Launch Time"]
    getting = (
        info["Finish Time"] - info["Getting Result Time"] if info["Getting Result Time"] else 0
    )
    parts = {
        "run": metrics["Executor Run Time"],
        "deserialize": metrics["Executor Deserialize Time"],
        "result_serialize": metrics["Result Serialization Time"],
        "getting_result": getting,
    }
    shuffle_read = metrics.get("Shuffle Read Metrics", {})
    shuffle_write = metrics.get("Shuffle Write Metrics", {})
    totals["tasks"] += 1
    totals["task_seconds"] += duration / 1000
    for name, ms in parts.items():
        totals[f"{name}_seconds"] += ms / 1000
    totals["scheduler_delay_seconds"] += max(0, duration - sum(parts.values())) / 1000
    totals["gc_seconds"] += metrics["JVM GC Time"] / 1000
    totals["shuffle_write_seconds"] += shuffle_write.get("Shuffle Write Time", 0) / 1e9
    totals["cpu_seconds"] += (
        metrics["Executor CPU Time"] + metrics["Executor Deserialize CPU Time"]
    ) / 1e9
    totals["shuffle_remote_mb"] += shuffle_read.get("Remote Bytes Read", 0) / 1e6
    totals["shuffle_local_mb"] += shuffle_read.get("Local Bytes Read", 0) / 1e6
    totals["shuffle_fetch_wait_seconds"] += shuffle_read.get("Fetch Wait Time", 0) / 1000
    totals["shuffle_written_mb"] += shuffle_write.get("Shuffle Bytes Written", 0) / 1e6


# --------------------------------------------------------------------------- the measures


def measure_bronze(ctx: Context, plan: ClusterPlan) -> dict[str, Any]:
    """Bronze throughput on each profile, ``plan.repeats`` times, the order alternating; every
    run reads the same offsets (checked) and leaves its event log."""
    base = Setup(ctx.workdir / "cluster-bronze", ctx.jars_dir, ctx.bootstrap,
                 plan.commit_records, ("conflux",), topic_tag="_cluster")  # fmt: skip
    event_logs: dict[str, list[Path]] = {name: [] for name in PROFILES}

    def setup_of(profile: str, index: int) -> Setup:
        events, spark_conf = ctx.event_log(f"bronze-{profile}-{index}")
        event_logs[profile].append(events)
        return replace(base, workdir=base.workdir / profile, spark_conf=spark_conf,
                       overrides=ctx.overrides(profile, f"bronze-{index}"))  # fmt: skip

    say("cluster: bronze throughput")
    runs, _produced = alternating_runs(base, PROFILES, plan.records, plan.repeats, setup_of)
    metrics = ("records_per_second", "steady_records_per_second", "cold_start_seconds",
               "cpu_seconds")  # fmt: skip
    return {
        "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()},
        "tasks": {name: [task_times(e) for e in logs] for name, logs in event_logs.items()},
        "summary": {
            name: {m: median([float(getattr(r, m)) for r in rs]) for m in metrics}
            for name, rs in runs.items()
        },
    }


def measure_silver(ctx: Context, plan: ClusterPlan) -> dict[str, Any]:
    """Silver at ``plan.rate`` on each profile, once, local first (each a fresh flow and topic)."""
    pace = Pace(plan.rate, plan.seconds, plan.warmup)
    results = {}
    for n, profile in enumerate(PROFILES):
        events, spark_conf = ctx.event_log(f"silver-{profile}")
        say(f"cluster: silver on {profile}")
        result = run_design(ctx.workdir / "cluster-silver", ctx.jars_dir, ctx.bootstrap, pace,
                            plan.design, plan.interval, 10 + n, ctx.overrides(profile, "silver"),
                            f"_{profile}", spark_conf)  # fmt: skip
        results[profile] = {**result, "tasks": task_times(events)}
        say(f"cluster: silver on {profile}: {json.dumps(results[profile])}")
    return results


def run_cluster(
    workdir: Path, jars_dir: Path, bootstrap: str, plan: ClusterPlan, command: str
) -> Outcome:
    """The benchmark: its own store and cluster around both measures (see the module doc)."""
    data: dict[str, Any] = {"label": LABEL, "plan": asdict(plan), "command": command}
    with (
        own_store(workdir / "s3-runtime", jars_dir) as store,
        own_cluster(workdir / "cluster-runtime", jars_dir) as cluster,
    ):
        data["cluster"] = {k: cluster[k] for k in ("master_url", "isolation", "ready_seconds")}
        ctx = Context(workdir, jars_dir, bootstrap, store, str(cluster["master_url"]))
        data["bronze"] = measure_bronze(ctx, plan)
        data["silver"] = measure_silver(ctx, plan)
    data["comparison"] = comparison(data)
    title = "local mode against the project's Spark cluster"
    return Outcome(rows(data), data, markdown_table(data), title)


# --------------------------------------------------------------------------- report


def comparison(data: dict[str, Any]) -> list[dict[str, Any]]:
    """(measure, size, unit, format, local, cluster, cluster / local) of every figure."""
    p, b, s = data["plan"], data["bronze"], data["silver"]
    runs = f"median of {p['repeats']} run{'s' if p['repeats'] > 1 else ''} each"
    bronze_size = f"{p['records']:,} records, commits of {p['commit_records']:,}; {runs}"
    silver_size = (f"{p['rate']:g} change events/s for {p['seconds']:g} s after a "
                   f"{p['warmup']:g} s warm-up, trigger every {p['interval']}")  # fmt: skip
    behind = [n for n in PROFILES if _silver(s[n], "busy_rows_per_second") < p["rate"]]
    if behind:
        silver_size += (f"; did NOT keep up on {' and '.join(behind)} (busy throughput below the "
                        "rate): the latencies measure a backlog that grew while producing")  # fmt: skip
    lines: list[tuple[str, str, str, str, float, float]] = []
    for metric, label, unit, form in (
        ("records_per_second", "bronze throughput, exec → exit", "records/s", "{:,.0f}"),
        ("steady_records_per_second", "bronze throughput, steady state", "records/s", "{:,.0f}"),
        ("cold_start_seconds", "bronze cold start (exec → first commit)", "s", "{:.1f}"),
        (
            "cpu_seconds",
            "bronze: CPU of the driver's process tree (a cluster's executors "
            "not included: their tasks' CPU is below)",
            "s",
            "{:.1f}",
        ),
    ):
        lines.append((label, bronze_size, unit, form, b["summary"]["local"][metric],
                      b["summary"]["cluster"][metric]))  # fmt: skip
    lines += [
        ("silver: produce → visible in current state, p50", silver_size, "ms", "{:,.0f}",
         s["local"]["latency_ms"]["p50"], s["cluster"]["latency_ms"]["p50"]),
        ("silver: produce → visible in current state, p99", silver_size, "ms", "{:,.0f}",
         s["local"]["latency_ms"]["p99"], s["cluster"]["latency_ms"]["p99"]),
        ("silver batch duration, median", silver_size, "ms", "{:,.0f}",
         _silver(s["local"], "median"), _silver(s["cluster"], "median")),
        ("silver throughput while busy", silver_size, "rows/s", "{:,.0f}",
         _silver(s["local"], "busy_rows_per_second"),
         _silver(s["cluster"], "busy_rows_per_second")),
    ]  # fmt: skip
    return [
        {"measure": m, "size": size, "unit": unit, "format": form, "local": local,
         "cluster": cluster, "ratio": cluster / local if local else float("nan")}
        for m, size, unit, form, local, cluster in lines
    ]  # fmt: skip


#: The task-metric sums of :func:`task_times` the report shows: key, label, unit, format.
TASK_FIGURES = (
    ("tasks", "tasks", "", "{:,.0f}"),
    ("task_seconds", "task time, launch → finish", "s", "{:.1f}"),
    ("run_seconds", "of which running", "s", "{:.1f}"),
    ("deserialize_seconds", "of which deserializing the task", "s", "{:.1f}"),
    ("scheduler_delay_seconds", "of which scheduler delay", "s", "{:.1f}"),
    ("result_serialize_seconds", "of which serializing results", "s", "{:.2f}"),
    ("getting_result_seconds", "of which sending results to the driver", "s", "{:.2f}"),
    ("cpu_seconds", "tasks' CPU", "s", "{:.1f}"),
    ("gc_seconds", "tasks' GC", "s", "{:.1f}"),
    ("failed_tasks", "tasks that failed or were lost (left out above)", "", "{:,.0f}"),
    ("shuffle_written_mb", "shuffle written", "MB", "{:.2f}"),
    ("shuffle_write_seconds", "writing shuffle files", "s", "{:.2f}"),
    ("shuffle_local_mb", "shuffle read from this host's disk", "MB", "{:.2f}"),
    ("shuffle_remote_mb", "shuffle read over the network", "MB", "{:.2f}"),
    ("shuffle_fetch_wait_seconds", "waiting for shuffle blocks", "s", "{:.2f}"),
    ("executors_ready_seconds", "application start → last executor registered", "s", "{:.1f}"),
)


def breakdown_table(data: dict[str, Any]) -> list[str]:
    """Where the tasks' time went: bronze's first run and silver's run, local against cluster
    ("—": a figure the run's version of :func:`task_times` did not collect)."""
    runs = {
        "bronze, run 1": {name: data["bronze"]["tasks"][name][0] for name in PROFILES},
        "silver": {name: data["silver"][name]["tasks"] for name in PROFILES},
    }
    heads = [f"{run} {name}" for run in runs for name in PROFILES]
    lines = [f"| summed over every task | {' | '.join(heads)} |", "|---" * (len(heads) + 1) + "|"]
    for key, label, unit, form in TASK_FIGURES:
        cells = [f"{form.format(tasks[name][key])} {unit}".strip() if key in tasks[name] else "—"
                 for tasks in runs.values() for name in PROFILES]  # fmt: skip
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return lines


def _silver(result: dict[str, Any], key: str) -> float:
    """A figure of the silver stage's batches in one profile's run (NaN if it had none)."""
    return float(result["batch_ms"].get("silver", {}).get(key, float("nan")))


def rows(data: dict[str, Any]) -> list[Row]:
    """The run's result rows: one per line of the comparison."""
    return side_by_side_rows("cluster", data, PROFILES, ("local mode", "cluster"), LABEL)


def markdown_table(data: dict[str, Any]) -> str:
    """The side-by-side table (BENCHMARKS.md's section and the run's Markdown block)."""
    lines = side_by_side_table(data, PROFILES, ("local mode", "cluster"))
    cluster = data["cluster"]
    lines += ["", "Where the tasks' time went (each run's Spark event log):", "",
              *breakdown_table(data)]  # fmt: skip
    lines += [
        "",
        f"\\* {LABEL}. The benchmark's own cluster ({cluster['master_url']}, isolation "
        f"{cluster['isolation']}, ready in {cluster['ready_seconds']} s): a master and two "
        "workers, one executor of one core and 1 GiB on each; both profiles read Kafka and keep "
        "their tables and checkpoints on the benchmark's own S3 store (s3proxy on loopback). "
        "The executors share this host's disk, so Spark reads their shuffle blocks from it "
        "(`spark.shuffle.readHostLocalDisk`) rather than over the network.",
        "",
        f"Command: `{data['command']}`",
    ]
    return "\n".join(lines)

"""``bronze_throughput``: four runners over the same topic, side by side.

* ``conflux``: Conflux's bronze flow (``python -m pipelines.runner``, availableNow), spec shaped like
  ``flows/orders.yaml``;
* ``spark_default``: the minimal hand-written PySpark Kafka → Delta job a user writes, with Spark's
  defaults (``bench/baseline_job.py``);
* ``deltars``: one Python process, confluent-kafka + delta-rs (``bench/python_writer.py``);
* ``consume``: the same consume loop writing nothing: the ceiling.

Every runner commits the same number of records at a time (``--commit-records``: Spark's
``maxOffsetsPerTrigger``, the writer's batch), runs as a fresh process (cold start timed from
exec) into a new table; each repetition runs every runner once, in the order given. Per run: wall time, cold start (exec → the
first commit holding rows, read from the table's ``_delta_log``), steady state (records of the
commits after the first over the time between the first commit and the last: start-up and the
first batch's warm-up excluded), peak resident memory of the process group and CPU seconds. Every
table is then read back with delta-rs: exactly the topic's records, each (partition, offset) once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import yaml

from bench.delta_commits import data_commits, location_of
from bench.harness import (
    BENCH_DIR,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    bench_settings,
    conflux_env,
    last_json_line,
    median,
    run_id,
    say,
)
from bench.orders import ProduceStats, create_topic, delete_topic, produce_fast
from pipelines.location import Location

FLOW = "bench_orders"
TABLE = "bronze_bench_orders"
RUN_TIMEOUT = 3600.0
RUNNERS = ("conflux", "spark_default", "deltars", "consume")
WRITER_RESULT = "bench.writer "


@dataclass(frozen=True)
class Setup:
    workdir: Path
    jars_dir: Path
    bootstrap: str
    commit_records: int
    runners: tuple[str, ...] = RUNNERS
    keep_tables: bool = False
    #: Settings fields of Conflux's runner (the ``store`` benchmark: lake and checkpoints on S3).
    overrides: Mapping[str, Any] = field(default_factory=dict)
    #: Spark settings of Conflux's runner (the ``cluster`` benchmark: its event log).
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    #: Part of the topic's name, so that two benchmarks of one run never share a topic.
    topic_tag: str = ""


@dataclass
class Run:
    """One timed run of one runner over the whole topic."""

    runner: str
    records: int
    index: int
    wall_seconds: float
    cold_start_seconds: float
    steady_records_per_second: float
    commits: int
    peak_rss_mb: float
    cpu_seconds: float
    query_started_seconds: float | None = None
    rows_verified: int = 0
    offsets_verified: int = 0
    #: Per partition: [partition, first offset, last offset, records]; the same for every runner.
    offsets: list[list[int]] = field(default_factory=list)
    commit_seconds: list[float] = field(default_factory=list)
    commit_sizes: list[int] = field(default_factory=list)

    @property
    def records_per_second(self) -> float:
        return self.records / self.wall_seconds

    @property
    def cpu_seconds_per_million(self) -> float:
        return self.cpu_seconds / (self.records / 1e6)


def topic_of(setup: Setup, records: int) -> str:
    return f"bench_orders{setup.topic_tag}_{records}_{run_id(setup.workdir)}"


def conflux_spec(topic: str, commit_records: int) -> dict[str, Any]:
    """The shipped ``flows/orders.yaml`` shape, on the benchmark topic."""
    return {
        "name": FLOW,
        "source": {
            "kind": "kafka",
            "topics": [topic],
            "starting_offsets": "earliest",
            "max_offsets_per_trigger": commit_records,
        },
        "target": {"table": TABLE, "partition_by": ["ingest_date"]},
        "trigger": {"mode": "available_now"},
    }


def _command(
    setup: Setup, runner: str, topic: str, runtime: Path, table: Location
) -> tuple[list[str], str]:
    """The runner's command line and the text it prints when its query / loop started."""
    if runner == "conflux":
        spec = runtime / "flows" / f"{FLOW}.yaml"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(yaml.safe_dump(conflux_spec(topic, setup.commit_records)))
        command = [PYTHON, "-m", "pipelines.runner", "--spec", str(spec)]
        return [*command, "--trigger", "available_now"], "conflux: started flows"
    common = ["--bootstrap", setup.bootstrap, "--topic", topic]
    if runner == "spark_default":
        command = [PYTHON, str(BENCH_DIR / "baseline_job.py"), *common, "--table", str(table)]
        command += ["--checkpoint", str(runtime / "checkpoint")]
        return [*command, "--max-offsets", str(setup.commit_records)], "baseline: query started"
    command = [PYTHON, str(BENCH_DIR / "python_writer.py"), "--mode", runner, *common]
    command += ["--table", str(table), "--until-end"]
    return [*command, "--commit-records", str(setup.commit_records)], "bench.writer started"


def table_of(setup: Setup, runner: str, runtime: Path) -> Location:
    """Where the runner writes: Conflux's bronze table under its settings' lake, a local
    folder for the others."""
    if runner != "conflux":
        return Location.local(runtime / "table")
    settings = bench_settings(runtime, setup.jars_dir, setup.bootstrap, overrides=setup.overrides)
    return settings.lake / "bronze" / TABLE


def run_one(setup: Setup, runner: str, records: int, index: int) -> Run:
    runtime = setup.workdir / f"{runner}-{records}-{index}"
    table = table_of(setup, runner, runtime)
    command, started_text = _command(setup, runner, topic_of(setup, records), runtime, table)
    env = conflux_env(runtime, setup.jars_dir, setup.bootstrap, dict(setup.spark_conf),
                      setup.overrides)  # fmt: skip
    with Child(command, env, runtime / "run.log") as child:
        query_started = child.wait_for_text(started_text, RUN_TIMEOUT)
        wall = child.wait_ok(RUN_TIMEOUT)
        sampler, spawned, output = child.sampler, child.spawned_epoch, child.output()
    if runner == "consume":
        result = last_json_line(output, WRITER_RESULT)
        ends = [spawned + 0.0] + [c["end_epoch"] for c in result["commits"]]
        sizes = [c["records"] for c in result["commits"]]
        _check_consumed(result, records)
        rows = distinct = result["records"]
        offsets = [
            [int(p), v["first"], v["last"], v["count"]] for p, v in result["partitions"].items()
        ]
    else:
        commits = data_commits(table)
        ends = [spawned] + [c.timestamp_ms / 1000 for c in commits]
        sizes = [c.records for c in commits]
        rows, distinct, offsets = verify_table(table, records)
    if not setup.keep_tables:
        table.remove_tree()
    commit_seconds = [b - a for a, b in pairwise(ends)]
    steady_seconds = ends[-1] - ends[1]
    return Run(
        runner=runner,
        records=records,
        index=index,
        wall_seconds=wall,
        cold_start_seconds=ends[1] - spawned,
        steady_records_per_second=sum(sizes[1:]) / steady_seconds if steady_seconds else 0.0,
        commits=len(sizes),
        peak_rss_mb=sampler.peak_rss_bytes / 1e6,
        cpu_seconds=sampler.cpu_seconds,
        query_started_seconds=query_started,
        rows_verified=rows,
        offsets_verified=distinct,
        offsets=sorted(offsets),
        commit_seconds=commit_seconds,
        commit_sizes=sizes,
    )


def verify_table(table: Path | Location, records: int) -> tuple[int, int, list[list[int]]]:
    """(rows, distinct (partition, offset), per partition [partition, first, last, records]) of
    ``table``, read with delta-rs; raises unless rows and distinct offsets both equal ``records``
    and every partition's offsets run from 0 without a gap."""
    from deltalake import DeltaTable

    location = location_of(table)
    delta = DeltaTable(str(location), storage_options=location.delta_rs_options())
    coordinates = delta.to_pyarrow_table(columns=["partition", "offset"])
    per_partition = coordinates.group_by("partition").aggregate(
        [("offset", "count"), ("offset", "count_distinct"), ("offset", "min"), ("offset", "max")]
    )
    distinct = pc.sum(per_partition["offset_count_distinct"]).as_py() or 0
    gaps = [
        row
        for row in per_partition.to_pylist()
        if row["offset_min"] != 0 or row["offset_max"] != row["offset_count_distinct"] - 1
    ]
    if coordinates.num_rows != records or distinct != records or gaps:
        raise BenchError(
            f"{table} holds {coordinates.num_rows} rows, {distinct} distinct offsets "
            f"(expected {records} each); partitions not 0..n-1: {gaps}"
        )
    offsets = [
        [row["partition"], row["offset_min"], row["offset_max"], row["offset_count"]]
        for row in per_partition.to_pylist()
    ]
    return coordinates.num_rows, distinct, offsets


def check_same_offsets(runs: list[Run]) -> None:
    """Every runner got exactly the same (partition, first, last, count) per partition."""
    distinct = {json.dumps(r.offsets) for r in runs}
    if len(distinct) > 1:
        details = "; ".join(f"{r.runner} {r.index}: {r.offsets}" for r in runs)
        raise BenchError(f"the runners did not get the same offsets: {details}")


def _check_consumed(result: dict[str, Any], records: int) -> None:
    partitions = result["partitions"].values()
    wrong = (
        result["records"] != records
        or result["sequence_breaks"]
        or any(p["first"] != 0 or p["last"] != p["count"] - 1 for p in partitions)
    )
    if wrong:
        raise BenchError(f"the consume loop read {json.dumps(result)[:500]}, expected {records}")


def run_throughput(setup: Setup, sizes: list[int], repeats: int) -> Outcome:
    runs: list[Run] = []
    produced: dict[int, ProduceStats] = {}
    for records in sizes:
        topic = topic_of(setup, records)
        create_topic(setup.bootstrap, topic, partitions=3)
        say(f"throughput: producing {records:,} order events to {topic}")
        produced[records] = produce_fast(setup.bootstrap, topic, records)
        say(f"  {produced[records].records_per_second:,.0f} records/s")
        for index in range(1, repeats + 1):
            for runner in setup.runners:
                say(f"throughput: {runner}, {records:,} records, run {index} of {repeats}")
                run = run_one(setup, runner, records, index)
                say(f"  {run.wall_seconds:.1f} s wall, cold start {run.cold_start_seconds:.1f} s, "
                    f"steady {run.steady_records_per_second:,.0f} records/s")  # fmt: skip
                runs.append(run)
        delete_topic(setup.bootstrap, topic)  # frees its disk before the next size
        check_same_offsets([r for r in runs if r.records == records])
    return outcome(produced, runs, setup)


# --------------------------------------------------------------------------- report

METRICS = {
    "records_per_second": ("records/s, exec → exit", "{:,.0f}"),
    "steady_records_per_second": ("records/s, steady state", "{:,.0f}"),
    "wall_seconds": ("wall s", "{:.1f}"),
    "cold_start_seconds": ("cold start s (exec → first commit)", "{:.1f}"),
    "peak_rss_mb": ("peak RSS MB", "{:,.0f}"),
    "cpu_seconds_per_million": ("CPU s per M records", "{:.1f}"),
}


def spread(runs: list[Run], metric: str) -> dict[str, float]:
    values = [float(getattr(r, metric)) for r in runs]
    return {"min": min(values), "median": median(values), "max": max(values)}


def summary(runs: list[Run]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """records → runner → metric → min / median / max."""
    table: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for run in runs:
        mine = [r for r in runs if r.runner == run.runner and r.records == run.records]
        table.setdefault(str(run.records), {})[run.runner] = {m: spread(mine, m) for m in METRICS}
    return table


def outcome(produced: dict[int, ProduceStats], runs: list[Run], setup: Setup) -> Outcome:
    figures = summary(runs)
    data = {
        "commit_records": setup.commit_records,
        "produce": {
            str(k): {**asdict(v), "records_per_second": v.records_per_second}
            for k, v in produced.items()
        },
        "runs": [
            {
                **asdict(r),
                "records_per_second": r.records_per_second,
                "cpu_seconds_per_million": r.cpu_seconds_per_million,
            }
            for r in runs
        ],
        "summary": figures,
        "ratios": ratios(figures),
    }
    return Outcome(rows(figures, produced), data, runs_table(runs))


RATIOS = (
    ("conflux", "deltars", "steady_records_per_second"),
    ("conflux", "deltars", "records_per_second"),
    ("conflux", "spark_default", "records_per_second"),
    ("conflux", "spark_default", "steady_records_per_second"),
    ("deltars", "consume", "steady_records_per_second"),
)


def ratios(figures: dict[str, dict[str, dict[str, dict[str, float]]]]) -> dict[str, float]:
    """``<records>: <a> / <b> <metric>`` → ratio of the medians (higher is better for a)."""
    result = {}
    for records, by_runner in figures.items():
        for a, b, metric in RATIOS:
            if a in by_runner and b in by_runner and by_runner[b][metric]["median"]:
                value = by_runner[a][metric]["median"] / by_runner[b][metric]["median"]
                result[f"{records}: {a} / {b} {metric}"] = value
    return result


def rows(
    figures: dict[str, dict[str, dict[str, dict[str, float]]]],
    produced: dict[int, ProduceStats],
) -> list[Row]:
    result = []
    for records, by_runner in figures.items():
        stats = produced[int(records)]
        size = stats.payload_bytes / stats.records
        for runner, metrics in by_runner.items():
            for metric, (label, form) in METRICS.items():
                m = metrics[metric]
                value = form.format(m["median"])
                notes = f"min {form.format(m['min'])}, max {form.format(m['max'])}"
                if metric == "records_per_second":
                    notes += f"; {m['median'] * size / 1e6:.1f} MB/s of payload"
                result.append(
                    Row("bronze_throughput", f"{records} {runner}: {label}", value, notes)
                )
    for name, ratio in ratios(figures).items():
        result.append(Row("bronze_throughput", f"ratio {name}", f"{ratio:.2f}", "medians"))
    return result


def runs_table(runs: list[Run]) -> str:
    lines = [
        "| records | runner | run | wall s | cold start s | steady records/s | commits "
        "| peak RSS MB | CPU s | rows = offsets verified |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.records:,} | {r.runner} | {r.index} | {r.wall_seconds:.1f} "
            f"| {r.cold_start_seconds:.1f} | {r.steady_records_per_second:,.0f} | {r.commits} "
            f"| {r.peak_rss_mb:,.0f} | {r.cpu_seconds:.1f} | {r.rows_verified:,} |"
        )
    return "\n".join(lines)


def alternating_runs(
    base: Setup,
    names: tuple[str, str],
    records: int,
    repeats: int,
    setup_of: Callable[[str, int], Setup],
) -> tuple[dict[str, list[Run]], ProduceStats]:
    """Conflux's bronze flow over one fresh topic of ``records``, ``repeats`` times on each of
    two set-ups (``setup_of(name, index)``), the first name first on odd repetitions and last on
    even ones, so neither always runs on a warmer machine; every run read the same offsets
    (checked). The benchmarks that compare two places side by side (``store``, ``cluster``)."""
    topic = topic_of(base, records)
    create_topic(base.bootstrap, topic, partitions=3)
    runs: dict[str, list[Run]] = {name: [] for name in names}
    try:
        say(f"producing {records:,} order events to {topic}")
        produced = produce_fast(base.bootstrap, topic, records)
        for index in range(1, repeats + 1):
            for name in names if index % 2 else names[::-1]:
                say(f"bronze throughput on {name}, run {index} of {repeats}")
                run = run_one(setup_of(name, index), "conflux", records, index)
                say(f"  {run.records_per_second:,.0f} records/s exec → exit, steady "
                    f"{run.steady_records_per_second:,.0f}, cold start "
                    f"{run.cold_start_seconds:.1f} s")  # fmt: skip
                runs[name].append(run)
    finally:
        delete_topic(base.bootstrap, topic)
    check_same_offsets([run for name in names for run in runs[name]])
    return runs, produced

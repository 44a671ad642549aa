"""``bronze_throughput``: Conflux's bronze flow against a minimal PySpark job, on the same data.

Both run as fresh processes with the same Spark settings, the same availableNow trigger and the
same ``maxOffsetsPerTrigger``, alternately (A B A B ...), each into its own new table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.event_log import PHASES, breakdown, event_log_conf
from bench.harness import (
    BENCH_DIR,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    conflux_env,
    last_json_line,
    median,
    run_python,
    say,
)
from bench.orders import ProduceStats, create_topic, produce_fast

TOPIC = "bench_orders"
FLOW = "bench_orders"
TABLE = "bronze_bench_orders"
RUN_TIMEOUT = 3600.0
PIPELINES = ("conflux", "baseline")


@dataclass
class PipelineRun:
    """One timed run of one pipeline over the whole topic."""

    pipeline: str
    index: int
    table: str
    wall_seconds: float
    startup_seconds: float
    batches: list[dict[str, int]] = field(default_factory=list)
    rows_verified: int | None = None
    distinct_offsets: int | None = None
    breakdown: dict[str, float] | None = None

    @property
    def data_batches(self) -> list[dict[str, int]]:
        return [b for b in self.batches if b["input_rows"] > 0]

    @property
    def batch_seconds(self) -> float:
        return sum(b["batch_duration_ms"] for b in self.data_batches) / 1000

    @property
    def input_rows(self) -> int:
        return sum(b["input_rows"] for b in self.data_batches)


@dataclass(frozen=True)
class Setup:
    workdir: Path
    jars_dir: Path
    bootstrap: str
    max_offsets: int
    event_log: bool = False

    def env(self, runtime: Path, bootstrap: str | None = None) -> dict[str, str]:
        extra = event_log_conf(runtime / "events") if self.event_log else None
        return conflux_env(runtime, self.jars_dir, bootstrap, extra)

    def add_breakdown(self, run: PipelineRun, runtime: Path) -> PipelineRun:
        if self.event_log:
            run.breakdown = breakdown(runtime / "events")
        return run


def conflux_spec(max_offsets: int) -> dict[str, Any]:
    """The shipped ``flows/orders.yaml`` shape, on the benchmark topic."""
    return {
        "name": FLOW,
        "source": {
            "kind": "kafka",
            "topics": [TOPIC],
            "starting_offsets": "earliest",
            "max_offsets_per_trigger": max_offsets,
        },
        "target": {"table": TABLE, "partition_by": ["ingest_date"]},
        "trigger": {"mode": "available_now"},
    }


def run_conflux(setup: Setup, index: int) -> PipelineRun:
    runtime = setup.workdir / f"conflux-{index}"
    spec = runtime / "flows" / f"{FLOW}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(conflux_spec(setup.max_offsets)))
    command = [PYTHON, "-m", "pipelines.runner", "--spec", str(spec)]
    command += ["--trigger", "available_now"]
    with Child(command, setup.env(runtime, setup.bootstrap), runtime / "runner.log") as child:
        startup = child.wait_for_text("conflux: started flows", RUN_TIMEOUT)
        wall = child.wait_ok(RUN_TIMEOUT)
        output = child.output()
    batches = [
        json.loads(line.removeprefix("conflux.progress "))
        for line in output.splitlines()
        if line.startswith("conflux.progress ")
    ]
    table = str(runtime / "lake" / "bronze" / TABLE)
    run = PipelineRun("conflux", index, table, wall, startup, _batch_fields(batches))
    return setup.add_breakdown(run, runtime)


def run_baseline(setup: Setup, index: int) -> PipelineRun:
    runtime = setup.workdir / f"baseline-{index}"
    table = runtime / "lake" / "bronze" / "baseline"
    command = [PYTHON, str(BENCH_DIR / "baseline_job.py"), "--bootstrap", setup.bootstrap]
    command += ["--topic", TOPIC, "--table", str(table)]
    command += ["--checkpoint", str(runtime / "checkpoints" / "baseline")]
    command += ["--max-offsets", str(setup.max_offsets)]
    with Child(command, setup.env(runtime), runtime / "job.log") as child:
        startup = child.wait_for_text("baseline: query started", RUN_TIMEOUT)
        wall = child.wait_ok(RUN_TIMEOUT)
        batches = last_json_line(child.output(), "bench.baseline ")["batches"]
    run = PipelineRun("baseline", index, str(table), wall, startup, _batch_fields(batches))
    return setup.add_breakdown(run, runtime)


def _batch_fields(batches: list[dict[str, Any]]) -> list[dict[str, int]]:
    keys = ("batch_id", "input_rows", "batch_duration_ms")
    return [{key: int(batch[key]) for key in keys} for batch in batches]


def run_pipelines(setup: Setup, repeats: int) -> list[PipelineRun]:
    """Conflux and the baseline alternately, ``repeats`` times each (A B A B ...)."""
    runs = []
    for index in range(1, repeats + 1):
        for pipeline in PIPELINES:
            say(f"throughput: {pipeline} run {index} of {repeats}")
            run = (run_conflux if pipeline == "conflux" else run_baseline)(setup, index)
            say(f"  {run.wall_seconds:.1f} s wall, {len(run.data_batches)} batches "
                f"taking {run.batch_seconds:.1f} s, {run.input_rows} rows")  # fmt: skip
            runs.append(run)
    return runs


def verify(setup: Setup, runs: list[PipelineRun], records: int) -> None:
    """Every table holds exactly ``records`` rows, each Kafka record once; raise otherwise."""
    say("verifying the row counts of every table with Spark")
    args = ["count"] + [arg for run in runs for arg in ("--table", run.table)]
    env = conflux_env(setup.workdir / "verify", setup.jars_dir)
    output = run_python("table_checks.py", args, env, setup.workdir / "verify.log", 1800)
    counts = last_json_line(output, "bench.counts ")
    for run in runs:
        run.rows_verified = counts[run.table]["rows"]
        run.distinct_offsets = counts[run.table]["distinct_offsets"]
    wrong = [r for r in runs if r.rows_verified != records or r.distinct_offsets != records]
    if wrong:
        details = ", ".join(
            f"{r.pipeline} {r.index}: {r.rows_verified} rows, {r.distinct_offsets} distinct"
            for r in wrong
        )
        raise BenchError(f"tables do not hold exactly {records} records: {details}")


def run_throughput(setup: Setup, records: int, repeats: int) -> Outcome:
    bootstrap = setup.bootstrap
    create_topic(bootstrap, TOPIC, partitions=3)
    say(f"producing {records} order events to {TOPIC}")
    produced = produce_fast(bootstrap, TOPIC, records)
    say(f"  produced in {produced.seconds:.1f} s ({produced.records_per_second:,.0f} records/s)")
    runs = run_pipelines(setup, repeats)
    verify(setup, runs, records)
    return _outcome(produced, runs, records, setup.max_offsets)


# --------------------------------------------------------------------------- report


def _medians(runs: list[PipelineRun], records: int) -> dict[str, dict[str, float]]:
    result = {}
    for pipeline in PIPELINES:
        mine = [r for r in runs if r.pipeline == pipeline]
        result[pipeline] = {
            "wall_seconds": median([r.wall_seconds for r in mine]),
            "startup_seconds": median([r.startup_seconds for r in mine]),
            "batch_seconds": median([r.batch_seconds for r in mine]),
            "records_per_second_wall": median([records / r.wall_seconds for r in mine]),
            "records_per_second_batches": median([records / r.batch_seconds for r in mine]),
        }
    return result


def _outcome(
    produced: ProduceStats, runs: list[PipelineRun], records: int, max_offsets: int
) -> Outcome:
    medians = _medians(runs, records)
    data = {
        "records": records,
        "max_offsets_per_trigger": max_offsets,
        "produce": {**asdict(produced), "records_per_second": produced.records_per_second},
        "runs": [{**asdict(r), "batch_seconds": r.batch_seconds} for r in runs],
        "medians": medians,
        "ratio_conflux_to_baseline_wall": _ratio(medians, "records_per_second_wall"),
        "ratio_conflux_to_baseline_batches": _ratio(medians, "records_per_second_batches"),
    }
    rows = _produce_rows(produced) + _summary_rows(medians, len(runs) // 2)
    extra = _runs_table(runs, records)
    if all(r.breakdown for r in runs):
        extra += "\n\nFrom the Spark event logs (seconds):\n\n" + _breakdown_table(runs)
    return Outcome(rows, data, extra)


def _ratio(medians: dict[str, dict[str, float]], key: str) -> float:
    return medians["conflux"][key] / medians["baseline"][key]


def _produce_rows(produced: ProduceStats) -> list[Row]:
    size = produced.payload_bytes / produced.records
    return [
        Row("bronze_throughput", "produce (confluent-kafka, 3 partitions)",
            f"{produced.records_per_second:,.0f} records/s",
            f"{produced.records:,} records of {size:.0f} B avg in {produced.seconds:.1f} s "
            f"({produced.megabytes_per_second:.1f} MB/s), payload generation included"),
    ]  # fmt: skip


def _summary_rows(medians: dict[str, dict[str, float]], repeats: int) -> list[Row]:
    rows = []
    for pipeline in PIPELINES:
        m = medians[pipeline]
        rows.append(Row("bronze_throughput", f"{pipeline}: process start → exit (median of {repeats})",
                        f"{m['records_per_second_wall']:,.0f} records/s",
                        f"{m['wall_seconds']:.1f} s, of which {m['startup_seconds']:.1f} s "
                        "until the query started"))  # fmt: skip
        rows.append(Row("bronze_throughput", f"{pipeline}: sum of micro-batch durations (median)",
                        f"{m['records_per_second_batches']:,.0f} records/s",
                        f"{m['batch_seconds']:.1f} s in batches"))  # fmt: skip
    for key, label in (
        ("records_per_second_wall", "wall"),
        ("records_per_second_batches", "batches"),
    ):
        rows.append(Row("bronze_throughput", f"ratio conflux / baseline ({label})",
                        f"{_ratio(medians, key):.2f}", "records/s, medians"))  # fmt: skip
    return rows


def _runs_table(runs: list[PipelineRun], records: int) -> str:
    lines = [
        "| run | pipeline | wall s | until query started s | batches | sum of batches s "
        "| batch durations s | records/s (wall) | records/s (batches) | rows in table | distinct offsets |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, r in enumerate(runs, start=1):
        lines.append(
            f"| {number} | {r.pipeline} | {r.wall_seconds:.1f} | {r.startup_seconds:.1f} "
            f"| {len(r.data_batches)} | {r.batch_seconds:.1f} | {_durations(r)} "
            f"| {records / r.wall_seconds:,.0f} "
            f"| {records / r.batch_seconds:,.0f} | {r.rows_verified:,} | {r.distinct_offsets:,} |"
        )
    return "\n".join(lines)


def _durations(run: PipelineRun) -> str:
    return ", ".join(f"{b['batch_duration_ms'] / 1000:.1f}" for b in run.data_batches)


BREAKDOWN_COLUMNS = (
    "app_start_to_query_start",
    *PHASES,
    "task_run",
    "task_cpu",
    "last_batch_end_to_app_end",
)


def _breakdown_table(runs: list[PipelineRun]) -> str:
    lines = [
        "| run | pipeline | " + " | ".join(BREAKDOWN_COLUMNS) + " |",
        "|---|---|" + "---|" * len(BREAKDOWN_COLUMNS),
    ]
    for number, r in enumerate(runs, start=1):
        values = r.breakdown or {}
        cells = " | ".join(f"{values.get(c, float('nan')):.1f}" for c in BREAKDOWN_COLUMNS)
        lines.append(f"| {number} | {r.pipeline} | {cells} |")
    return "\n".join(lines)

"""``e2e_latency``: produce time → visible in bronze, for the runner in continuous mode.

Events carry their produce time (``produced_ms``). After a graceful stop (SIGTERM), each row is
matched to the Delta commit that added its data file; that commit's timestamp is when the row
became visible. ``ingested_at`` (the micro-batch start) splits the latency into the wait for a
batch to start and the batch itself.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
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
from bench.orders import Pace, create_topic, produce_one, produce_paced, timed_event

TOPIC = "bench_latency"
FLOW = "bench_latency"
TABLE = "bronze_bench_latency"
PROGRESS = "conflux.progress "


def latency_spec(interval: str) -> dict[str, Any]:
    return {
        "name": FLOW,
        "source": {"kind": "kafka", "topics": [TOPIC], "starting_offsets": "earliest"},
        "target": {"table": TABLE, "partition_by": ["ingest_date"]},
        "trigger": {"mode": "continuous", "interval": interval},
    }


def progress(output: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix(PROGRESS))
        for line in output.splitlines()
        if line.startswith(PROGRESS)
    ]


def records_read(output: str) -> int:
    """Records of the topic the runner has committed so far (its latest end offsets)."""
    ends = [b["end_offsets"].get(TOPIC, {}) for b in progress(output) if b["end_offsets"]]
    return max((sum(e.values()) for e in ends), default=0)


def wait_caught_up(child: Child, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while records_read(child.output()) < expected:
        if child.process.poll() is not None:
            raise BenchError(f"the runner exited {child.process.returncode}:\n{child.tail()}")
        if time.monotonic() >= deadline:
            raise BenchError(f"the runner did not read {expected} records in {timeout:.0f} s")
        time.sleep(0.2)


def run_runner(
    runtime: Path, jars_dir: Path, bootstrap: str, pace: Pace
) -> tuple[list[dict[str, Any]], float]:
    """Run the flow while producing; return (the batches since warm, graceful stop seconds)."""
    spec = runtime / "flows" / f"{FLOW}.yaml"
    command = [PYTHON, "-m", "pipelines.runner", "--spec", str(spec)]
    env = conflux_env(runtime, jars_dir, bootstrap)
    with Child(command, env, runtime / "runner.log") as child:
        child.wait_for_text("conflux: started flows", 600)
        produce_one(bootstrap, TOPIC, *timed_event(-1, time.time()))
        wait_caught_up(child, 1, 300)
        warm = len(progress(child.output()))
        say(f"latency: runner up; producing {pace.rate:g} events/s for "
            f"{pace.warmup:g} s (warm-up) + {pace.seconds:g} s")  # fmt: skip
        events = produce_paced(bootstrap, TOPIC, pace)
        wait_caught_up(child, events + 1, 300)
        stopping = time.monotonic()
        child.process.send_signal(signal.SIGTERM)  # the driver only: it stops gracefully
        child.wait_ok(300)
        stop_seconds = time.monotonic() - stopping
        batches = progress(child.output())[warm:]
    return batches, stop_seconds


def run_latency(
    workdir: Path, jars_dir: Path, bootstrap: str, pace: Pace, interval: str
) -> Outcome:
    runtime = workdir / "latency"
    spec = runtime / "flows" / f"{FLOW}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(latency_spec(interval)))
    create_topic(bootstrap, TOPIC, partitions=3)
    batches, stop_seconds = run_runner(runtime, jars_dir, bootstrap, pace)
    say("latency: reading the bronze table and its commits with Spark")
    table = runtime / "lake" / "bronze" / TABLE
    env = conflux_env(workdir / "latency-check", jars_dir)
    output = run_python("table_checks.py", ["latency", "--table", str(table)], env,
                        workdir / "latency-check.log", 900)  # fmt: skip
    report = last_json_line(output, "bench.latency ")
    if report["count"] != pace.measured_events:
        raise BenchError(
            f"bronze holds {report['count']} measured events, {pace.measured_events} were produced"
        )
    return _outcome(report, batches, stop_seconds, pace, interval)


def _outcome(
    report: dict[str, Any],
    batches: list[dict[str, Any]],
    stop_seconds: float,
    pace: Pace,
    interval: str,
) -> Outcome:
    durations = [int(b["batch_duration_ms"]) for b in batches]
    batch_stats = {
        "batches": len(durations),
        "median_batch_ms": median([float(d) for d in durations]) if durations else 0.0,
        "max_batch_ms": max(durations, default=0),
    }
    data = {**report, **batch_stats, "graceful_stop_seconds": stop_seconds,
            "pace": asdict(pace), "interval": interval}  # fmt: skip
    return Outcome(_rows(report, batch_stats, stop_seconds, pace, interval), data)


def _ms(stats: dict[str, float]) -> str:
    return " / ".join(f"{stats[k]:,.0f}" for k in ("p50", "p95", "p99", "max"))


def _rows(
    report: dict[str, Any],
    batches: dict[str, Any],
    stop_seconds: float,
    pace: Pace,
    interval: str,
) -> list[Row]:
    setup = (
        f"{report['count']:,} events at {pace.rate:g}/s for {pace.seconds:g} s after a "
        f"{pace.warmup:g} s warm-up at the same rate; trigger every {interval}"
    )
    return [
        Row("e2e_latency", "produce → Delta commit visible, p50 / p95 / p99 / max",
            f"{_ms(report['visible_ms'])} ms", setup),
        Row("e2e_latency", "  same, to the commit file's mtime instead of commitInfo.timestamp",
            f"{_ms(report['log_file_mtime_ms'])} ms", "p50 / p95 / p99 / max"),
        Row("e2e_latency", "  of which produce → micro-batch start (ingested_at)",
            f"{_ms(report['wait_for_batch_ms'])} ms", "p50 / p95 / p99 / max"),
        Row("e2e_latency", "  of which micro-batch start → commit",
            f"{_ms(report['batch_start_to_commit_ms'])} ms", "p50 / p95 / p99 / max"),
        Row("e2e_latency", "micro-batches while producing",
            f"{batches['batches']}",
            f"{report['commits']} commits hold the events; batch duration median "
            f"{batches['median_batch_ms']:,.0f} ms, max {batches['max_batch_ms']:,} ms"),
        Row("e2e_latency", "graceful stop (SIGTERM → exit 0)", f"{stop_seconds:.1f} s", ""),
    ]  # fmt: skip

"""``spark_session_start``: a Conflux SparkSession (Delta + Kafka jars) in a fresh process."""

from __future__ import annotations

from pathlib import Path

from bench.harness import (
    BENCH_DIR,
    PYTHON,
    Child,
    Outcome,
    Row,
    conflux_env,
    last_json_line,
    median,
    say,
)


def one_run(workdir: Path, jars_dir: Path, index: int) -> dict[str, float]:
    """One fresh process: timings from the child plus process start → first count."""
    runtime = workdir / f"session-{index}"
    command = [PYTHON, str(BENCH_DIR / "session_child.py")]
    with Child(command, conflux_env(runtime, jars_dir), runtime / "session.log") as child:
        exit_seconds = child.wait_ok(timeout=300)
        timings = last_json_line(child.output(), "bench.session ")
    return {
        "create_to_count_seconds": timings["create_to_count_seconds"],
        "session_seconds": timings["session_seconds"],
        "first_count_seconds": timings["first_count_seconds"],
        "imports_seconds": timings["imports_done_epoch"] - child.spawned_epoch,
        "process_to_count_seconds": timings["count_done_epoch"] - child.spawned_epoch,
        "process_exit_seconds": exit_seconds,
    }


def run_session_start(workdir: Path, jars_dir: Path, runs: int) -> Outcome:
    results = []
    for index in range(1, runs + 1):
        result = one_run(workdir, jars_dir, index)
        say(f"session start run {index}: {result['create_to_count_seconds']:.2f} s")
        results.append(result)
    medians = {key: median([r[key] for r in results]) for key in results[0]}
    return Outcome(_rows(results, medians), {"runs": results, "medians": medians})


def _rows(results: list[dict[str, float]], medians: dict[str, float]) -> list[Row]:
    def runs(key: str) -> str:
        return "runs: " + ", ".join(f"{r[key]:.2f}" for r in results)

    label = f"(median of {len(results)})"
    return [
        Row("spark_session_start", f"get_spark_session() → first range(1).count() {label}",
            f"{medians['create_to_count_seconds']:.2f} s", runs("create_to_count_seconds")),
        Row("spark_session_start", f"  of which getOrCreate() {label}",
            f"{medians['session_seconds']:.2f} s", runs("session_seconds")),
        Row("spark_session_start", f"  of which the first job {label}",
            f"{medians['first_count_seconds']:.2f} s", runs("first_count_seconds")),
        Row("spark_session_start", f"process start → first count {label}",
            f"{medians['process_to_count_seconds']:.2f} s",
            f"incl. Python imports {medians['imports_seconds']:.2f} s; " + runs(
                "process_to_count_seconds")),
        Row("spark_session_start", f"process start → exit {label}",
            f"{medians['process_exit_seconds']:.2f} s", "incl. JVM shutdown"),
    ]  # fmt: skip

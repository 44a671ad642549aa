"""Shared plumbing of the benchmarks: child processes, their environment, result rows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines.processes import group_pids
from pipelines.settings import Settings, load_settings, settings_environment

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = PROJECT_ROOT / "bench"
PYTHON = sys.executable
POLL_SECONDS = 0.05
WORKDIR_PREFIX = "conflux-bench-"


class BenchError(RuntimeError):
    """A benchmark could not run or its result is wrong (e.g. a table misses rows)."""


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    benchmark: str
    metric: str
    value: str
    notes: str = ""

    def markdown(self) -> str:
        return f"| {self.benchmark} | {self.metric} | {self.value} | {self.notes} |"


@dataclass(frozen=True)
class Outcome:
    """What one benchmark reports: table rows, raw data for the JSON file, extra Markdown."""

    rows: list[Row]
    data: dict[str, Any]
    extra: str = ""
    #: The heading of ``extra`` after the benchmark's name.
    extra_title: str = "every run"


def say(message: str) -> None:
    """Progress messages go to stderr, so stdout holds only the Markdown results."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def run_id(workdir: Path) -> str:
    """A suffix unique to this benchmark run (its temporary folder), for topic names: a broker
    given with ``--bootstrap`` may hold an earlier run's topics."""
    for part in workdir.parts:
        if part.startswith(WORKDIR_PREFIX):
            return part.removeprefix(WORKDIR_PREFIX).lower()
    return workdir.name.lower()


def bench_settings(
    runtime_dir: Path,
    jars_dir: Path,
    bootstrap: str | None = None,
    spark_conf: dict[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings of a benchmark process in ``runtime_dir`` (UI off), ignoring this process's
    ``CONFLUX_*`` variables. ``overrides``: other fields of :class:`Settings` (the lake and
    checkpoint roots and the S3 store of the ``store`` benchmark)."""
    return replace(
        load_settings(environ={}),
        runtime_dir=runtime_dir,
        jars_dir=jars_dir,
        flows_dir=runtime_dir / "flows",
        kafka_bootstrap_servers=bootstrap,
        spark_conf={"spark.ui.enabled": "false", **(spark_conf or {})},
        **(overrides or {}),
    )


def conflux_env(
    runtime_dir: Path,
    jars_dir: Path,
    bootstrap: str | None = None,
    spark_conf: dict[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """A child environment where ``load_settings()`` returns :func:`bench_settings`.

    Mirrors ``settings_env`` of the integration tests: inherited ``CONFLUX_*`` variables are
    dropped, and so is a Dagster Pipes context, so the runner reports on stdout only.
    ``spark_conf`` adds Spark settings (``CONFLUX_SPARK_CONF``).
    """
    settings = bench_settings(runtime_dir, jars_dir, bootstrap, spark_conf, overrides)
    base = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES_")}
    env = settings_environment(settings, base)
    return env


def last_json_line(text: str, prefix: str) -> dict[str, Any]:
    """The JSON document after ``prefix`` on the last line that starts with it."""
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    if not lines:
        raise BenchError(f"no line starting with {prefix!r} in the output")
    return dict(json.loads(lines[-1][len(prefix) :]))


# --------------------------------------------------------------------------- child processes


def reap_group(pgid: int, timeout: float = 30.0) -> None:
    """Wait until group ``pgid`` is gone (a JVM may outlive its Python parent), else SIGKILL it."""
    deadline = time.monotonic() + timeout
    while group_pids(pgid):
        if time.monotonic() >= deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 10.0
        time.sleep(0.1)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class GroupSampler:
    """Samples a process group every ``interval`` s: peak resident memory and CPU seconds.

    Memory is the sum of the group's resident sets (driver JVM, its executors in local mode, the
    Python driver; pages shared between them are counted once per process). CPU is user + system
    time of every process seen, each at its last sample, until the whole group is gone (a JVM may
    outlive its Python parent): the last ``interval`` before a process exits, and processes living
    less than ``interval`` (the Spark launcher's ``java``), are not counted.
    """

    def __init__(self, pgid: int, interval: float = 0.1) -> None:
        self.pgid, self.interval = pgid, interval
        self.peak_rss_bytes = 0
        self.cpu_ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu_ticks.values()) / CLOCK_TICKS

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            total = 0
            for pid in group_pids(self.pgid):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                except OSError:
                    continue
                self.cpu_ticks[pid] = int(fields[11]) + int(fields[12])
                total += int(fields[21]) * PAGE_BYTES
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Child:
    """A subprocess in its own process group with its output in ``log``.

    Use it as a context manager: on exit the whole group (Python driver and JVM) is killed if it
    still runs, so an error in the harness never leaves a Spark application behind.
    """

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.spawned_epoch = time.time()
        self.started = time.monotonic()
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.sampler = GroupSampler(self.process.pid)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait_for_text(self, text: str, timeout: float) -> float:
        """Seconds since spawn when ``text`` appeared in the log; raises if it never does."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.process.poll() is not None:
                raise BenchError(f"{self.log.name}: exited {self.process.returncode} before "
                                 f"{text!r}:\n{self.tail()}")  # fmt: skip
            if time.monotonic() >= deadline:
                raise BenchError(f"{self.log.name}: no {text!r} after {timeout:.0f} s")
            time.sleep(POLL_SECONDS)
        return self.elapsed()

    def wait_ok(self, timeout: float) -> float:
        """Wait for a zero exit; return seconds since spawn. Raises on timeout or failure."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"{self.log.name}: still running after {timeout:.0f} s") from exc
        seconds = self.elapsed()
        if code != 0:
            raise BenchError(f"{self.log.name}: exit code {code}:\n{self.tail()}")
        return seconds

    def close(self) -> None:
        """Kill the group if the child still runs; wait until no process of it is left."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        reap_group(self.process.pid)
        self.sampler.stop()


def run_python(script: str, args: list[str], env: dict[str, str], log: Path, timeout: float) -> str:
    """Run ``bench/<script>`` to completion and return its output; raises unless it exits 0."""
    with Child([PYTHON, str(BENCH_DIR / script), *args], env, log) as child:
        child.wait_ok(timeout)
        return child.output()


def serve_plan_child(
    argv: list[str], name: str, result_prefix: str, measure: Callable[[Any, dict[str, Any]], Any]
) -> int:
    """The child side of :func:`run_plan_child`: read ``--plan``, run ``measure(spark, plan)``
    in a Spark session of its own and print its JSON result after ``result_prefix``."""
    import argparse

    from pipelines.spark import get_spark_session

    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help="JSON: the plan's fields")
    plan = json.loads(parser.parse_args(argv).plan)
    spark = get_spark_session(f"bench-{name}", ui=False)
    result = measure(spark, plan)
    print(result_prefix + json.dumps(result), flush=True)
    spark.stop()
    return 0


def run_plan_child(
    name: str,
    plan: Any,
    workdir: Path,
    jars_dir: Path,
    result_prefix: str,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``bench/<name>.py --plan <plan as JSON>`` in a runtime folder of its own (log
    ``<workdir>/<name>.log``) and return the JSON line it printed after ``result_prefix``.
    ``overrides``: settings fields of the child (:func:`bench_settings`); they reach it through
    its environment, never its command line (an S3 secret among them)."""
    output = run_python(
        f"{name}.py",
        ["--plan", json.dumps(plan.__dict__)],
        conflux_env(workdir / name, jars_dir, overrides=overrides),
        workdir / f"{name}.log",
        6 * 3600,
    )
    return last_json_line(output, result_prefix)

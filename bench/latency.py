"""``e2e_latency``: produce → visible in bronze, as a reader sees it, at several event rates.

A reader polls the table with delta-rs (``DeltaTable.update_incremental()`` every
:data:`POLL_SECONDS`) and notes when each new version appears; a row's latency is that moment
minus its Kafka timestamp (CreateTime, stamped by the producer when it sends). The table first
receives ``table_rows`` records (the target is stated for a table of at least 1M rows, so every
commit pays for a big table's log), then events are produced at each rate in turn: a warm-up, then
the measured seconds; the runner must catch up before the next rate, else the rate is reported as
where it broke. Runners: ``conflux`` (the bronze flow in continuous mode with the given trigger
interval) and ``deltars`` (``bench/python_writer.py`` committing what arrived at least every
interval), each on a topic of its own. The table may be on an S3 store (the ``store`` benchmark):
the reader then reaches it with delta-rs's storage options, as a reader of that store would.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from bench.delta_commits import commit_actions, commit_versions
from bench.harness import (
    BENCH_DIR,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    bench_settings,
    conflux_env,
    run_id,
    say,
)
from bench.orders import (
    Pace,
    create_topic,
    delete_topic,
    order_event,
    produce_fast,
    produce_paced,
)
from pipelines.location import Location

FLOW = "bench_latency"
TABLE = "bronze_bench_latency"
POLL_SECONDS = 0.05
CATCH_UP_SECONDS = 120.0
LATENCY_RUNNERS = ("conflux", "deltars")
PERCENTILES = (50, 95, 99)
UNITS_PER_MS = {"s": 1e-3, "ms": 1.0, "us": 1e3, "ns": 1e6}


@dataclass(frozen=True)
class Plan:
    rates: tuple[float, ...]
    seconds: float
    warmup: float
    interval_ms: int
    table_rows: int
    runners: tuple[str, ...] = LATENCY_RUNNERS


@dataclass
class Phase:
    """One rate: what was produced and what the reader saw of it."""

    rate: float
    produced: int
    kept_up: bool
    catch_up_seconds: float
    latencies_ms: dict[str, float] = field(default_factory=dict)
    #: The 0th, 1st, ..., 100th percentile: the distribution, for the plot.
    quantiles_ms: list[float] = field(default_factory=list)
    rows_seen: int = 0
    commits: int = 0


class VersionPoller:
    """A delta-rs reader in a thread: when each version of the table was first seen, rows so far."""

    def __init__(self, table: Location) -> None:
        self.table = table
        self.seen: dict[int, float] = {}
        self.rows = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from deltalake import DeltaTable

        table, last = None, -1
        try:
            while not self._stop.wait(POLL_SECONDS):
                if table is None:
                    if not commit_versions(self.table):
                        continue  # no commit yet
                    table = DeltaTable(
                        str(self.table), storage_options=self.table.delta_rs_options()
                    )
                else:
                    table.update_incremental()
                version = table.version()
                if version > last:
                    now = time.time()
                    for new in range(last + 1, version + 1):
                        self.seen[new] = now
                        self.rows += sum(rows for _, rows in _added(self.table, new))
                    last = version
        except BaseException as exc:  # reported by the harness thread
            self.error = exc

    def wait_rows(self, rows: int, timeout: float) -> float | None:
        """Seconds until the table held ``rows`` rows, or None after ``timeout``."""
        started = time.monotonic()
        while self.rows < rows:
            if self.error is not None:
                raise BenchError(f"the delta-rs reader failed: {self.error}")
            if time.monotonic() - started > timeout:
                return None
            time.sleep(POLL_SECONDS)
        return time.monotonic() - started

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _added(table: Location, version: int) -> list[tuple[str, int]]:
    """(data file, rows) of what commit ``version`` added (row counts from its stats)."""
    result = []
    for action in commit_actions(table, version):
        if "add" in action and action["add"].get("stats"):
            rows = int(json.loads(action["add"]["stats"])["numRecords"])
            result.append((unquote(action["add"]["path"]), rows))
    return result


def latency_key(rate: float, measured: bool, index: int) -> bytes:
    return f"{'m' if measured else 'w'}:{rate:g}:{index}".encode()


def paced_event(pace: Pace) -> Any:
    def make(index: int, now: float) -> tuple[bytes, bytes]:
        measured = index >= pace.warmup_events
        _, value = order_event(index, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
        return latency_key(pace.rate, measured, index), value

    return make


def _command(runner: str, plan: Plan, runtime: Path, topic: str, bootstrap: str) -> list[str]:
    if runner == "conflux":
        spec = runtime / "flows" / f"{FLOW}.yaml"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(yaml.safe_dump({
            "name": FLOW,
            "source": {"kind": "kafka", "topics": [topic], "starting_offsets": "earliest"},
            "target": {"table": TABLE, "partition_by": ["ingest_date"]},
            "trigger": {"mode": "continuous", "interval": f"{plan.interval_ms} milliseconds"},
        }))  # fmt: skip
        return [PYTHON, "-m", "pipelines.runner", "--spec", str(spec)]
    command = [PYTHON, str(BENCH_DIR / "python_writer.py"), "--mode", "deltars"]
    command += ["--bootstrap", bootstrap, "--topic", topic, "--table", str(runtime / "table")]
    return [*command, "--max-wait-ms", str(plan.interval_ms), "--commit-records", "250000"]


def run_runner(
    runner: str,
    plan: Plan,
    workdir: Path,
    jars_dir: Path,
    bootstrap: str,
    overrides: Mapping[str, Any] | None = None,
    tag: str = "",
) -> dict:
    """One runner's phases. ``overrides``: settings fields of Conflux's runner (its lake and
    checkpoints on S3); ``tag``: part of the runtime folder's and the topic's names."""
    runtime = workdir / f"latency-{runner}{tag}"
    topic = f"bench_latency_{runner}{tag}_{run_id(workdir)}"
    if runner == "conflux":
        table = bench_settings(runtime, jars_dir, overrides=overrides).lake / "bronze" / TABLE
    else:
        table = Location.local(runtime / "table")
    create_topic(bootstrap, topic, partitions=3)
    say(f"latency {runner}: {plan.table_rows:,} records first, so the table holds them")
    produce_fast(bootstrap, topic, plan.table_rows)
    command = _command(runner, plan, runtime, topic, bootstrap)
    phases: list[Phase] = []
    poller = VersionPoller(table)
    try:
        env = conflux_env(runtime, jars_dir, bootstrap, overrides=overrides)
        with Child(command, env, runtime / "run.log") as child:
            if poller.wait_rows(plan.table_rows, 600) is None:
                raise BenchError(f"{runner} did not write {plan.table_rows} rows in 600 s:\n"
                                 f"{child.tail()}")  # fmt: skip
            expected = plan.table_rows
            for rate in plan.rates:
                pace = Pace(rate, plan.seconds, plan.warmup)
                say(f"latency {runner}: {rate:g} events/s, {plan.warmup:g} s warm-up + "
                    f"{plan.seconds:g} s")  # fmt: skip
                expected += produce_paced(bootstrap, topic, pace, paced_event(pace))
                caught_up = poller.wait_rows(expected, CATCH_UP_SECONDS)
                phases.append(Phase(rate, pace.measured_events, caught_up is not None,
                                    caught_up if caught_up is not None else CATCH_UP_SECONDS))  # fmt: skip
                if caught_up is None:
                    say(f"  {runner} did not catch up within {CATCH_UP_SECONDS:g} s: stopping here")
                    break
            child.process.send_signal(signal.SIGTERM)
            child.wait_ok(300)
            peak_rss_mb = child.sampler.peak_rss_bytes / 1e6
    finally:
        poller.stop()
        delete_topic(bootstrap, topic)
    measure(table, poller.seen, phases)
    return {"runner": runner, "phases": [asdict(p) for p in phases], "peak_rss_mb": peak_rss_mb}


def measure(table: Location, seen: dict[int, float], phases: list[Phase]) -> None:
    """Fill each phase's latency percentiles from the data files of every version seen."""
    latencies: dict[str, list[float]] = {f"{p.rate:g}": [] for p in phases}
    commits: dict[str, set[int]] = {key: set() for key in latencies}
    for version, seen_at in sorted(seen.items()):
        for path, _ in _added(table, version):
            data = pq.read_table(
                pa.BufferReader((table / path).read_bytes()), columns=["key", "kafka_timestamp"]
            )
            keys = pc.cast(data["key"], "string").to_pylist()
            stamps = data["kafka_timestamp"]
            per_ms = UNITS_PER_MS[stamps.type.unit]
            stamps = pc.cast(stamps, pa.int64()).to_pylist()
            for key, stamp in zip(keys, stamps, strict=True):
                if not key or not key.startswith("m:"):
                    continue
                rate = key.split(":")[1]
                millis = stamp / per_ms
                if rate in latencies:
                    latencies[rate].append(seen_at * 1000 - millis)
                    commits[rate].add(version)
    for phase in phases:
        values = sorted(latencies[f"{phase.rate:g}"])
        phase.rows_seen, phase.commits = len(values), len(commits[f"{phase.rate:g}"])
        if phase.kept_up and phase.rows_seen != phase.produced:
            raise BenchError(f"{table}: {phase.rows_seen} measured rows at {phase.rate:g}/s, "
                             f"{phase.produced} produced")  # fmt: skip
        if values:
            phase.latencies_ms = {f"p{p}": percentile(values, p) for p in PERCENTILES}
            phase.latencies_ms["max"] = values[-1]
            phase.quantiles_ms = [values[0], *(percentile(values, q) for q in range(1, 101))]


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def summarize(values: list[float]) -> dict[str, float]:
    """p50 / p95 / p99, max, min and mean of ``values``, rounded to 0.1."""
    ordered = sorted(values)
    summary = {f"p{p}": round(percentile(ordered, p), 1) for p in PERCENTILES}
    summary.update(max=round(ordered[-1], 1), min=round(ordered[0], 1))
    summary["mean"] = round(sum(ordered) / len(ordered), 1)
    return summary


def run_latency(workdir: Path, jars_dir: Path, bootstrap: str, plan: Plan) -> Outcome:
    results = [run_runner(r, plan, workdir, jars_dir, bootstrap) for r in plan.runners]
    data = {"plan": asdict(plan), "poll_seconds": POLL_SECONDS, "runners": results}
    return Outcome(_rows(results, plan), data)


def _rows(results: list[dict[str, Any]], plan: Plan) -> list[Row]:
    rows = []
    for result in results:
        for phase in result["phases"]:
            stats = phase["latencies_ms"]
            value = " / ".join(
                f"{stats.get(k, float('nan')):,.0f}" for k in ("p50", "p95", "p99", "max")
            )
            notes = (f"{phase['rows_seen']:,} events in {phase['commits']} commits; table ≥ "
                     f"{plan.table_rows:,} rows; interval {plan.interval_ms} ms")  # fmt: skip
            if not phase["kept_up"]:
                notes += f"; did NOT catch up within {CATCH_UP_SECONDS:g} s after producing"
            rows.append(Row("e2e_latency",
                            f"{result['runner']} at {phase['rate']:g} events/s: "
                            "produce → seen by a delta-rs reader, p50 / p95 / p99 / max",
                            f"{value} ms", notes))  # fmt: skip
    return rows

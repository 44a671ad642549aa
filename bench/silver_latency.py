"""``silver_latency``: produce → visible in the current-state table, as a delta-rs reader sees it.

The runner runs a Debezium flow (bronze + silver with a ``current`` table keyed by ``id``) in
continuous mode while Debezium-shaped change events are produced at a steady rate (the envelope of
``platform/demo/cdc_events.py``'s :class:`ChangeEvent`; every event a new ``source.lsn``, keys
cycling through a pool so that later events update earlier keys, never two events of one key in a
second). The harness remembers when it sent each lsn.

A reader thread polls the current table with delta-rs (``DeltaTable.update_incremental``) every
:data:`POLL_SECONDS`; when a new version appears it notes the wall-clock time, then reads the
``(id, _sequence)`` of the rows that version's commit added (the commit's ``add`` files). An event
``(id, lsn)`` is visible from the first version that holds a row of ``id`` with ``_sequence >=
lsn`` (keys only move forward: there are no deletes). Latency = that version's first-seen time minus
produce time, for the events after the warm-up.

Designs compared in one run, each with a fresh flow, topic and runner: ``chaining: stream`` (silver
as its own query reading the bronze table) and ``chaining: bronze_batch`` (silver written in
bronze's ``foreachBatch``), for each trigger interval asked for.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml
from deltalake import DeltaTable

from bench import orders
from bench.harness import (
    PROJECT_ROOT,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    conflux_env,
    median,
    say,
)
from bench.latency import summarize
from bench.orders import Pace, create_topic

SCHEMA_DDL = "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP"
POLL_SECONDS = 0.05
KEY_POOL = 20_000
FIRST_LSN = 1_000_000
PERMUTE = 2_654_435_761
PROGRESS = "conflux.progress "


def _cdc_module() -> Any:
    path = PROJECT_ROOT / "platform" / "demo" / "cdc_events.py"
    spec = importlib.util.spec_from_file_location("bench_cdc_events", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CDC = _cdc_module()


def flow_spec(name: str, topic: str, chaining: str, interval: str) -> dict[str, Any]:
    return {
        "name": name,
        "source": {"kind": "kafka", "topics": [topic], "starting_offsets": "earliest"},
        "target": {"table": f"bronze_{name}"},
        "trigger": {"mode": "continuous", "interval": interval},
        "silver": {
            "format": "debezium",
            "schema": SCHEMA_DDL,
            "chaining": chaining,
            "current": {"table": f"{name}_current", "keys": ["id"]},
        },
    }


def change_event(index: int, now: float) -> tuple[int, bytes, bytes]:
    """(lsn, key, value) of event ``index``: an insert the first time its key comes, then updates."""
    key = index * PERMUTE % KEY_POOL
    lsn = FIRST_LSN + index
    ms = int(now * 1000)
    row = {
        "id": key,
        "name": f"Customer {key}",
        "email": f"c{key}.{index}@example.com",
        "tier": CDC.TIERS[index % len(CDC.TIERS)],
        "updated_at": CDC.iso_timestamp(ms),
    }
    event = CDC.ChangeEvent(
        id=key,
        op="c" if index < KEY_POOL else "u",
        lsn=lsn,
        after=row,
        source_ts_ms=ms,
        ts_ms=ms,
    )
    value = event.value()
    assert value is not None
    return lsn, event.key(), value


def produce_paced(
    bootstrap: str, topic: str, pace: Pace, first: int, sent: dict[int, float]
) -> int:
    """Produce change events ``first``.. at ``pace.rate``/s; record each one's send time by lsn."""

    def event(index: int, now: float) -> tuple[bytes, bytes]:
        lsn, key, value = change_event(first + index, now)
        sent[lsn] = now
        return key, value

    return orders.produce_paced(bootstrap, topic, pace, event)


@dataclass
class Reader:
    """Polls a Delta table with delta-rs; notes when each version is first seen and what it added."""

    path: Path
    seen: dict[int, float] = field(default_factory=dict)
    #: key -> [(version, _sequence)] of rows the version's commit added
    rows: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    max_sequence: int = -1
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="delta-rs-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        try:
            table: DeltaTable | None = None
            known = -1
            while not self._stop.is_set():
                if table is None and DeltaTable.is_deltatable(str(self.path)):
                    table = DeltaTable(str(self.path))
                    known = table.version()
                    self.seen[known] = time.time()
                    self._read_upto(known)
                elif table is not None:
                    table.update_incremental()
                    version = table.version()
                    if version > known:
                        now = time.time()
                        for v in range(known + 1, version + 1):
                            self.seen[v] = now
                        self._read(range(known + 1, version + 1))
                        known = version
                self._stop.wait(POLL_SECONDS)
        except BaseException as exc:  # reported by the harness
            self.error = exc

    def _read_upto(self, version: int) -> None:
        self._read(range(0, version + 1))

    def _read(self, versions: range) -> None:
        for version in versions:
            log = self.path / "_delta_log" / f"{version:020d}.json"
            for line in log.read_text().splitlines():
                action = json.loads(line) if line.strip() else {}
                add = action.get("add")
                if not add:
                    continue
                columns = pq.read_table(self.path / add["path"], columns=["id", "_sequence"])
                for key, sequence in zip(
                    columns["id"].to_pylist(), columns["_sequence"].to_pylist(), strict=True
                ):
                    self.rows.setdefault(key, []).append((version, sequence))
                    self.max_sequence = max(self.max_sequence, sequence)

    def visible_at(self, key: int, lsn: int) -> float | None:
        versions = [v for v, sequence in self.rows.get(key, []) if sequence >= lsn]
        return min((self.seen[v] for v in versions if v in self.seen), default=None)


def wait_for(reader: Reader, lsn: int, child: Child, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while reader.max_sequence < lsn:
        if reader.error is not None:
            raise BenchError(f"the delta-rs reader failed: {reader.error!r}")
        if child.process.poll() is not None:
            raise BenchError(f"the runner exited {child.process.returncode}:\n{child.tail()}")
        if time.monotonic() >= deadline:
            raise BenchError(f"lsn {lsn} not visible in {reader.path} after {timeout:.0f} s")
        time.sleep(0.1)


def progress(output: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix(PROGRESS))
        for line in output.splitlines()
        if line.startswith(PROGRESS)
    ]


def run_design(
    workdir: Path, jars_dir: Path, bootstrap: str, pace: Pace, chaining: str, interval: str, n: int
) -> dict[str, Any]:
    name = f"silverlat{n}"
    topic = f"bench_cdc_{n}"
    runtime = workdir / f"silver-latency-{n}"
    spec_file = runtime / "flows" / f"{name}.yaml"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(yaml.safe_dump(flow_spec(name, topic, chaining, interval)))
    create_topic(bootstrap, topic, partitions=3)
    current = runtime / "lake" / "silver" / f"{name}_current"
    reader = Reader(current)
    sent: dict[int, float] = {}
    env = conflux_env(runtime, jars_dir, bootstrap)
    command = [PYTHON, "-m", "pipelines.runner", "--spec", str(spec_file)]
    say(f"silver_latency: chaining {chaining}, trigger every {interval}: starting the runner")
    with Child(command, env, runtime / "runner.log") as child:
        child.wait_for_text("conflux: started ", 600)
        reader.start()
        try:
            first = produce_paced(bootstrap, topic, Pace(pace.rate, 0, 1 / pace.rate), 0, sent)
            wait_for(reader, FIRST_LSN, child, 300)  # the first event: every query has run
            warm = len(progress(child.output()))
            say(
                f"silver_latency: {chaining}: up; producing {pace.rate:g} events/s for "
                f"{pace.warmup:g} s (warm-up) + {pace.seconds:g} s"
            )
            total = produce_paced(bootstrap, topic, pace, first, sent)
            last = FIRST_LSN + first + total - 1
            wait_for(reader, last, child, 300)
            time.sleep(2 * POLL_SECONDS)
        finally:
            reader.stop()
        stopping = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        child.wait_ok(300)
        stop_seconds = time.monotonic() - stopping
        batches = progress(child.output())[warm:]
    if reader.error is not None:
        raise BenchError(f"the delta-rs reader failed: {reader.error!r}")
    measured_from = FIRST_LSN + first + pace.warmup_events
    latencies = []
    for lsn, produced in sent.items():
        if lsn < measured_from:
            continue
        key = (lsn - FIRST_LSN) * PERMUTE % KEY_POOL
        visible = reader.visible_at(key, lsn)
        if visible is None:
            raise BenchError(f"{chaining}: event lsn {lsn} (id {key}) never became visible")
        latencies.append((visible - produced) * 1000)
    measured_versions = [v for v, t in reader.seen.items() if t >= sent[measured_from]]
    durations: dict[str, list[float]] = {}
    for batch in batches:
        durations.setdefault(batch.get("stage", "bronze"), []).append(
            float(batch["batch_duration_ms"])
        )
    return {
        "chaining": chaining,
        "interval": interval,
        "events": len(latencies),
        "latency_ms": summarize(latencies),
        "versions_while_measuring": len(measured_versions),
        "batch_ms": {
            stage: {"batches": len(d), "median": median(d), "max": max(d)}
            for stage, d in durations.items()
        },
        "graceful_stop_seconds": round(stop_seconds, 1),
    }


def run_silver_latency(
    workdir: Path,
    jars_dir: Path,
    bootstrap: str,
    pace: Pace,
    designs: list[str],
    intervals: list[str],
) -> Outcome:
    results = []
    n = 0
    for interval in intervals:
        for chaining in designs:
            results.append(run_design(workdir, jars_dir, bootstrap, pace, chaining, interval, n))
            say(f"silver_latency: {json.dumps(results[-1])}")
            n += 1
    return _outcome(results, pace)


def _ms(stats: dict[str, float]) -> str:
    return " / ".join(f"{stats[k]:,.0f}" for k in ("p50", "p95", "p99", "max"))


def _outcome(results: list[dict[str, Any]], pace: Pace) -> Outcome:
    rows = []
    for r in results:
        batches = "; ".join(
            f"{stage} batches {b['batches']}, median {b['median']:,.0f} ms, max {b['max']:,.0f} ms"
            for stage, b in r["batch_ms"].items()
        )
        rows.append(
            Row(
                "silver_latency",
                f"chaining {r['chaining']}, trigger {r['interval']}: produce → current table "
                "seen by delta-rs, p50 / p95 / p99 / max",
                f"{_ms(r['latency_ms'])} ms",
                f"{r['events']:,} events at {pace.rate:g}/s for {pace.seconds:g} s after a "
                f"{pace.warmup:g} s warm-up; {r['versions_while_measuring']} table versions; "
                f"{batches}; graceful stop {r['graceful_stop_seconds']} s",
            )
        )
    by = {(r["chaining"], r["interval"]): r for r in results}
    for (chaining, interval), r in by.items():
        if chaining == "bronze_batch" and ("stream", interval) in by:
            s = by[("stream", interval)]["latency_ms"]
            b = r["latency_ms"]
            rows.append(
                Row(
                    "silver_latency",
                    f"ratio stream / bronze_batch, trigger {interval}",
                    " / ".join(f"{s[k] / b[k]:.2f}" for k in ("p50", "p95", "p99")),
                    "p50 / p95 / p99 latency (> 1: bronze_batch is faster)",
                )
            )
    data = {"results": results, "pace": asdict(pace)}
    return Outcome(rows, data)

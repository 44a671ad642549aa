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

Each rate asked for (``--silver-rates``, issue 25: 500, 2,000 and 5,000 changes/s, ten minutes
each after a minute of warm-up) runs with a fresh flow, topic and runner, for each trigger interval
and chaining design asked for: ``chaining: bronze_batch`` (silver written in bronze's
``foreachBatch``, the fresher) by default, ``chaining: stream`` (silver as its own query reading
the bronze table) on request, and ``hand_written`` (``bench/hand_written_cdc.py``: the minimal
MERGE job a user writes by hand, not exactly-once) beside them as a floor, reported as the ratio
Conflux / hand-written and never judged against a target; ``hand_written_exactly_once`` is that
job making Conflux's three writes (the MERGE, the events append, the bronze append last), each
with its batch's transaction id: the ratio to it is what the rest of Conflux's batch costs. At the
rates of ``--silver-history-rates`` the flow runs once more with a history table, whose latency is
measured from the same events (the hand-written job keeps none).

``silver_store`` (:func:`run_silver_store`): one design, the same rate and duration, run twice in
one run: the lake and checkpoints on the local disk, then on the benchmark's own S3 store
(s3proxy on loopback, ``bench/own_store.py``); the reader opens the ``s3a://`` current table with
delta-rs's storage options. Every store figure carries ``bench.store.LABEL``.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from deltalake import DeltaTable

from bench import orders
from bench.delta_commits import commit_actions, commit_versions
from bench.harness import (
    PROJECT_ROOT,
    PYTHON,
    BenchError,
    Child,
    Outcome,
    Row,
    bench_settings,
    conflux_env,
    median,
    say,
)
from bench.latency import summarize
from bench.orders import Pace, create_topic
from bench.own_store import own_store
from pipelines.location import Location

SCHEMA_DDL = "id BIGINT, name STRING, email STRING, tier STRING, updated_at TIMESTAMP"
POLL_SECONDS = 0.05
KEY_POOL = 20_000
FIRST_LSN = 1_000_000
PERMUTE = 2_654_435_761
PROGRESS = "conflux.progress "
#: The designs that are not Conflux (bench/hand_written_cdc.py): the minimal hand-written MERGE
#: job, and the same job making Conflux's three per-batch writes exactly once (the MERGE, the
#: events append, the bronze append last, each with the batch's transaction id): what those
#: writes cost on Delta.
HAND_WRITTEN = "hand_written"
HAND_WRITTEN_EXACTLY_ONCE = "hand_written_exactly_once"
HAND_WRITTEN_DESIGNS = (HAND_WRITTEN, HAND_WRITTEN_EXACTLY_ONCE)


def _cdc_module() -> Any:
    path = PROJECT_ROOT / "platform" / "demo" / "cdc_events.py"
    spec = importlib.util.spec_from_file_location("bench_cdc_events", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CDC = _cdc_module()


def flow_spec(
    name: str, topic: str, chaining: str, interval: str, history: bool = False
) -> dict[str, Any]:
    """The measured flow: a current table keyed by ``id``; with ``history`` a history table
    too (every event changes ``email``, so every update opens a version at its lsn)."""
    spec: dict[str, Any] = {
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
    if history:
        spec["silver"]["history"] = {"table": f"{name}_history"}
    return spec


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
    """Polls a Delta table with delta-rs; notes when each version is first seen and what it added.
    The table may be on an S3 store: delta-rs opens it with the location's storage options."""

    path: Location
    #: The column holding an event's lsn: ``_sequence`` (current), ``_valid_from`` (history).
    sequence_column: str = "_sequence"
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
                if table is None and commit_versions(self.path):
                    table = DeltaTable(str(self.path), storage_options=self.path.delta_rs_options())
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
            for action in commit_actions(self.path, version):
                add = action.get("add")
                if not add:
                    continue
                data = (self.path / unquote(add["path"])).read_bytes()
                columns = pq.read_table(pa.BufferReader(data), columns=["id", self.sequence_column])
                for key, sequence in zip(
                    columns["id"].to_pylist(),
                    columns[self.sequence_column].to_pylist(),
                    strict=True,
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
    workdir: Path,
    jars_dir: Path,
    bootstrap: str,
    pace: Pace,
    chaining: str,
    interval: str,
    n: int,
    overrides: dict[str, Any] | None = None,
    tag: str = "",
    spark_conf: dict[str, str] | None = None,
    history: bool = False,
) -> dict[str, Any]:
    """One design's run. ``overrides``: settings fields of the runner (its lake and checkpoints
    on S3, its master: they reach it through its environment only); ``tag``: part of the
    folder's and the topic's names; ``spark_conf``: Spark settings of the runner; ``history``:
    the flow keeps a history table too, and its latency is measured beside the current's."""
    topic = f"bench_cdc_{n}{tag}"
    runtime = workdir / f"silver-latency-{n}{tag}"
    create_topic(bootstrap, topic, partitions=3)
    lake = bench_settings(runtime, jars_dir, overrides=overrides).lake
    if chaining in HAND_WRITTEN_DESIGNS:
        if history or overrides:
            raise BenchError(f"{chaining} keeps no history table and runs on local disk only")
        exactly_once = chaining == HAND_WRITTEN_EXACTLY_ONCE
        command, tables = _hand_written(runtime, bootstrap, topic, interval, exactly_once)
    else:
        command, tables = _conflux_flow(runtime, lake, f"silverlat{n}", topic, chaining, interval,
                                        history)  # fmt: skip
    reader = Reader(tables[0])
    readers = [reader] + [Reader(table, "_valid_from") for table in tables[1:]]
    sent: dict[int, float] = {}
    env = conflux_env(runtime, jars_dir, bootstrap, spark_conf, overrides)
    say(f"silver_latency: chaining {chaining}, trigger every {interval}: starting the runner")
    with Child(command, env, runtime / "runner.log") as child:
        child.wait_for_text("conflux: started ", 600)
        for each in readers:
            each.start()
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
            for each in readers:
                wait_for(each, last, child, 300)
            time.sleep(2 * POLL_SECONDS)
        finally:
            for each in readers:
                each.stop()
        stopping = time.monotonic()
        child.process.send_signal(signal.SIGTERM)
        child.wait_ok(300)
        stop_seconds = time.monotonic() - stopping
        batches = progress(child.output())[warm:]
    measured_from = FIRST_LSN + first + pace.warmup_events
    latencies = _latencies(reader, sent, measured_from, chaining)
    measured_versions = [v for v, t in reader.seen.items() if t >= sent[measured_from]]
    durations: dict[str, list[float]] = {}
    rows: dict[str, int] = {}
    for batch in batches:
        stage = batch.get("stage", "bronze")
        durations.setdefault(stage, []).append(float(batch["batch_duration_ms"]))
        rows[stage] = rows.get(stage, 0) + int(batch.get("input_rows", 0))
    return {
        "chaining": chaining,
        "interval": interval,
        "events": len(latencies),
        "latency_ms": summarize(latencies),
        "versions_while_measuring": len(measured_versions),
        "batch_ms": {
            stage: {
                "batches": len(d),
                "median": median(d),
                "max": max(d),
                "rows": rows[stage],
                # rows per second of batch time: the stage's throughput while busy (silver: MERGE)
                "busy_rows_per_second": rows[stage] / (sum(d) / 1000) if sum(d) else 0.0,
            }
            for stage, d in durations.items()
        },
        "graceful_stop_seconds": round(stop_seconds, 1),
        **(
            {"history_latency_ms": summarize(_latencies(readers[1], sent, measured_from, chaining))}
            if history
            else {}
        ),
    }


def _conflux_flow(
    runtime: Path,
    lake: Location,
    name: str,
    topic: str,
    chaining: str,
    interval: str,
    history: bool,
) -> tuple[list[str], list[Location]]:
    """The runner's command for the measured flow, and its current (and history) table."""
    spec_file = runtime / "flows" / f"{name}.yaml"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(yaml.safe_dump(flow_spec(name, topic, chaining, interval, history)))
    tables = [lake / "silver" / f"{name}_current"]
    if history:
        tables.append(lake / "silver" / f"{name}_history")
    return [PYTHON, "-m", "pipelines.runner", "--spec", str(spec_file)], tables


def _hand_written(
    runtime: Path, bootstrap: str, topic: str, interval: str, exactly_once: bool
) -> tuple[list[str], list[Location]]:
    """The hand-written job's command (``bench/hand_written_cdc.py``) and its current table;
    ``exactly_once``: with Conflux's bronze and events appends, every write with its batch's id."""
    folder = runtime / "hand-written"
    command = [
        PYTHON, str(PROJECT_ROOT / "bench" / "hand_written_cdc.py"), "--bootstrap", bootstrap,
        "--topic", topic, "--table", str(folder / "current"), "--interval", interval,
        "--checkpoint", str(folder / "checkpoint"),
    ]  # fmt: skip
    if exactly_once:
        command += ["--transaction-ids", "--events", str(folder / "events"),
                    "--bronze", str(folder / "bronze")]  # fmt: skip
    return command, [Location.local(folder / "current")]


def _latencies(
    reader: Reader, sent: dict[int, float], measured_from: int, chaining: str
) -> list[float]:
    """Produce → first seen in the reader's table, in ms, of every event from ``measured_from``."""
    if reader.error is not None:
        raise BenchError(f"the delta-rs reader of {reader.path} failed: {reader.error!r}")
    latencies = []
    for lsn, produced in sent.items():
        if lsn < measured_from:
            continue
        key = (lsn - FIRST_LSN) * PERMUTE % KEY_POOL
        visible = reader.visible_at(key, lsn)
        if visible is None:
            raise BenchError(
                f"{chaining}: event lsn {lsn} (id {key}) never became visible in {reader.path}"
            )
        latencies.append((visible - produced) * 1000)
    return latencies


def run_silver_latency(
    workdir: Path,
    jars_dir: Path,
    bootstrap: str,
    paces: Sequence[Pace],
    designs: list[str],
    intervals: list[str],
    history_rates: Sequence[float] = (),
) -> Outcome:
    """Each pace with each trigger interval and chaining design, a fresh flow each; at the rates
    of ``history_rates`` once more with a history table in the flow (its latency measured too)."""
    runs = [(pace, False) for pace in paces]
    runs += [(pace, True) for pace in paces if pace.rate in history_rates]
    results: list[dict[str, Any]] = []
    for pace, history in runs:
        for interval in intervals:
            for chaining in designs:
                if history and chaining in HAND_WRITTEN_DESIGNS:
                    continue  # it keeps no history table
                result = run_design(
                    workdir, jars_dir, bootstrap, pace, chaining, interval, len(results),
                    history=history,
                )  # fmt: skip
                results.append({**result, "pace": asdict(pace), "history": history})
                say(f"silver_latency: {json.dumps(results[-1])}")
    return _outcome(results)


def _ms(stats: dict[str, float]) -> str:
    return " / ".join(f"{stats[k]:,.0f}" for k in ("p50", "p95", "p99", "max"))


def _outcome(results: list[dict[str, Any]]) -> Outcome:
    rows = []
    for r in results:
        pace = r["pace"]
        batches = "; ".join(
            f"{stage} batches {b['batches']}, median {b['median']:,.0f} ms, max {b['max']:,.0f} ms"
            for stage, b in r["batch_ms"].items()
        )
        run = _run_label(r)
        rows.append(
            Row(
                "silver_latency",
                f"{run}: produce → current table seen by delta-rs, p50 / p95 / p99 / max",
                f"{_ms(r['latency_ms'])} ms",
                f"{r['events']:,} events at {pace['rate']:g}/s for {pace['seconds']:g} s after a "
                f"{pace['warmup']:g} s warm-up; {r['versions_while_measuring']} table versions; "
                f"{batches}; graceful stop {r['graceful_stop_seconds']} s",
            )
        )
        if "history_latency_ms" in r:
            rows.append(
                Row(
                    "silver_latency",
                    f"{run}: produce → history table seen by delta-rs, p50 / p95 / p99 / max",
                    f"{_ms(r['history_latency_ms'])} ms",
                    "the same run and events: every update opens a version at its lsn",
                )
            )
    return Outcome(rows + _ratios(results), {"results": results})


#: Latency ratios a run reports when it measured both designs: (numerator, denominator, meaning).
RATIOS = (
    ("stream", "bronze_batch", "> 1: bronze_batch is faster"),
    ("bronze_batch", HAND_WRITTEN, "what Conflux's batch costs over a bare MERGE job"),
    ("bronze_batch", HAND_WRITTEN_EXACTLY_ONCE, "Conflux over the same exactly-once writes"),
)


def _ratios(results: list[dict[str, Any]]) -> list[Row]:
    by = {(r["chaining"], r["interval"], r["pace"]["rate"], r["history"]): r for r in results}
    rows = []
    for (chaining, interval, rate, history), r in by.items():
        for over, under, meaning in RATIOS:
            if chaining != under or (over, interval, rate, history) not in by:
                continue
            o, u = by[(over, interval, rate, history)]["latency_ms"], r["latency_ms"]
            rows.append(
                Row(
                    "silver_latency",
                    f"ratio {over} / {under}, {rate:g}/s, trigger {interval}"
                    + (", with a history table" if history else ""),
                    " / ".join(f"{o[k] / u[k]:.2f}" for k in ("p50", "p95", "p99")),
                    f"p50 / p95 / p99 latency ({meaning})",
                )
            )
    return rows


def _run_label(result: dict[str, Any]) -> str:
    """What one latency run was: its rate, chaining, trigger and whether it kept history."""
    label = (
        f"{result['pace']['rate']:g}/s, chaining {result['chaining']}, trigger {result['interval']}"
    )
    return label + (", with a history table" if result["history"] else "")


#: Issue 25's freshness targets: (table, rate, with a history table, p99 in ms).
P99_TARGETS_MS = (
    ("current", 500.0, False, 5_000.0),
    ("current", 5_000.0, False, 15_000.0),
    ("history", 500.0, True, 8_000.0),
)


def targets(results: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for issue 25's freshness targets this run measured (the best
    design at each rate)."""
    rows: list[tuple[str, str, str]] = []
    for table, rate, history, goal in P99_TARGETS_MS:
        key = "history_latency_ms" if table == "history" else "latency_ms"
        runs = [r for r in results if r["chaining"] not in HAND_WRITTEN_DESIGNS
                and r["pace"]["rate"] == rate and r["history"] == history and key in r]  # fmt: skip
        run = min(runs, key=lambda r: r[key]["p99"], default=None)
        if run is None:
            continue
        p99 = run[key]["p99"]
        rows.append((
            f"silver: p99 produce → {table} table <= {goal / 1000:g} s at {rate:,.0f} changes/s",
            f"{p99:,.0f} ms ({run['chaining']})", "met" if p99 <= goal else "**not met**",
        ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- silver_store
STORES = ("local", "store")


def run_silver_store(
    workdir: Path,
    jars_dir: Path,
    bootstrap: str,
    pace: Pace,
    chaining: str,
    interval: str,
    command: str,
) -> Outcome:
    """One design on the local disk, then on the benchmark's own S3 store; same pace."""
    from bench.store import LABEL

    results: dict[str, dict[str, Any]] = {}
    data: dict[str, Any] = {"label": LABEL, "pace": asdict(pace), "command": command}
    with own_store(workdir / "s3-runtime", jars_dir) as store:
        data["store"] = {"endpoint": store.connection.endpoint}
        for n, name in enumerate(STORES):
            overrides = store.settings("silver") if name == "store" else None
            say(f"silver_store: on {name}")
            results[name] = run_design(workdir / "silver-store", jars_dir, bootstrap, pace,
                                       chaining, interval, n, overrides, f"_{name}")  # fmt: skip
            say(f"silver_store: {name}: {json.dumps(results[name])}")
    data["results"] = results
    data["comparison"] = store_comparison(results)
    return Outcome(store_rows(data), data, store_markdown(data), "local disk against the S3 store")


def _stage(result: dict[str, Any], stage: str, key: str) -> float:
    return float(result["batch_ms"].get(stage, {}).get(key, float("nan")))


def store_comparison(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """(measure, unit, format, local, store, store / local) of every figure."""
    local, store = results["local"], results["store"]
    lines = [
        ("produce → visible in silver current, p50", "ms", "{:,.0f}",
         local["latency_ms"]["p50"], store["latency_ms"]["p50"]),
        ("produce → visible in silver current, p99", "ms", "{:,.0f}",
         local["latency_ms"]["p99"], store["latency_ms"]["p99"]),
        ("silver batches (warm-up + measured + drain)", "batches", "{:,.0f}",
         _stage(local, "silver", "batches"), _stage(store, "silver", "batches")),
        ("silver batch duration, median", "ms", "{:,.0f}",
         _stage(local, "silver", "median"), _stage(store, "silver", "median")),
        ("silver MERGE throughput while busy", "rows/s", "{:,.0f}",
         _stage(local, "silver", "busy_rows_per_second"),
         _stage(store, "silver", "busy_rows_per_second")),
        ("bronze batch duration, median", "ms", "{:,.0f}",
         _stage(local, "bronze", "median"), _stage(store, "bronze", "median")),
    ]  # fmt: skip
    return [
        {"measure": m, "unit": unit, "format": form, "local": lo, "store": st,
         "ratio": st / lo if lo else float("nan")}
        for m, unit, form, lo, st in lines
    ]  # fmt: skip


def _size(data: dict[str, Any]) -> str:
    p, r = data["pace"], data["results"]["local"]
    return (f"chaining {r['chaining']}, trigger {r['interval']}; {p['rate']:g} events/s for "
            f"{p['seconds']:g} s after a {p['warmup']:g} s warm-up")  # fmt: skip


def store_rows(data: dict[str, Any]) -> list[Row]:
    result = []
    for c in data["comparison"]:
        local, store = c["format"].format(c["local"]), c["format"].format(c["store"])
        result.append(Row("silver_store", f"{c['measure']}: local disk / S3 store (store / local)",
                          f"{local} / {store} {c['unit']} ({c['ratio']:.2f}x)",
                          f"{_size(data)}; store: {data['label']}"))  # fmt: skip
    return result


def store_markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Size: {_size(data)}.",
        "",
        "| measure | local disk | S3 store * | store / local |",
        "|---|---|---|---|",
    ]
    for c in data["comparison"]:
        local, store = c["format"].format(c["local"]), c["format"].format(c["store"])
        lines.append(f"| {c['measure']} | {local} {c['unit']} | {store} {c['unit']} "
                     f"| {c['ratio']:.2f} |")  # fmt: skip
    events = {name: r["events"] for name, r in data["results"].items()}
    lines += [
        "",
        f"\\* {data['label']}. The store is the benchmark's own s3proxy "
        f"({data['store']['endpoint']}, filesystem backend), sharing the machine's CPU with the "
        f"flow. Events measured: {events['local']:,} local, {events['store']:,} store.",
        "",
        f"Command: `{data['command']}`",
    ]
    return "\n".join(lines)

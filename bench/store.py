"""``store``: a flow on the local disk against the same flow on an S3 store, side by side in one run.

The benchmark starts its own S3 store (s3proxy with its filesystem backend, on 127.0.0.1, in its
temporary folder: ``bench/own_store.py``) and stops it at the end, also on errors. Each figure is
measured on the local disk and on the store in the same run, with settings that differ only in
where the lake and the checkpoints live (``lake_root`` / ``checkpoints_root`` on ``s3a://``):

1. bronze throughput: Conflux's bronze flow (``bench/throughput.py``'s runner, availableNow)
   reading the same topic twice, once per store; the order alternates per repetition;
2. produce → visible in bronze: ``bench/latency.py``'s runner at one modest rate, the delta-rs
   reader polling the table where it lives (on S3 through delta-rs's storage options);
3. a small Delta append (a few rows, one data file) from one Spark session to a local table and
   an ``s3a://`` one, alternately: on S3 through Conflux's conditional log store, which each
   commit's ``conflux-write-id`` metadata proves (``bench/store_commits.py``);
4. a lease renew (``FlowLease.renew``: read the newest term, create the next one, prune), pure
   Python, alternately on a local folder and on the store; the term's create alone is timed too.

s3proxy on loopback answers in a fraction of a millisecond and shares the machine's CPU with the
flow: the store's figures say what the S3 code path costs here, not what a real object store
(tens of milliseconds per request) would cost. Every store figure says so (:data:`LABEL`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.harness import BenchError, Outcome, Row, median, run_plan_child, say
from bench.latency import Plan as LatencyPlan
from bench.latency import percentile, run_runner
from bench.own_store import OwnStore, own_store
from bench.report import side_by_side_rows, side_by_side_table
from bench.throughput import Setup, alternating_runs
from pipelines.lease import FlowLease, LeaseTerm, StoredLeaseStore, new_owner_id
from pipelines.location import Location
from pipelines.storage import WRITE_ID, split_s3

LABEL = "s3proxy on loopback: not representative of a real object store's latency"
STORES = ("local", "store")
COMMITS_RESULT = "bench.store_commits "


@dataclass(frozen=True)
class StorePlan:
    records: int
    commit_records: int
    repeats: int
    rate: float
    seconds: float
    warmup: float
    interval_ms: int
    table_rows: int
    appends: int
    append_rows: int
    renews: int


@dataclass(frozen=True)
class Context:
    workdir: Path
    jars_dir: Path
    bootstrap: str
    store: OwnStore

    def overrides(self, name: str, prefix: str) -> dict[str, str]:
        """Settings fields of a run on ``name`` ("local": none, the runtime folder's lake)."""
        return self.store.settings(prefix) if name == "store" else {}


def order(index: int) -> tuple[str, ...]:
    """Local first on odd rounds, the store first on even ones."""
    return STORES if index % 2 else STORES[::-1]


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": median(ordered),
        "p90": percentile(ordered, 90),
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


# --------------------------------------------------------------------------- 1. throughput


def measure_throughput(ctx: Context, plan: StorePlan) -> dict[str, Any]:
    base = Setup(ctx.workdir / "store-throughput", ctx.jars_dir, ctx.bootstrap,
                 plan.commit_records, ("conflux",), topic_tag="_store")  # fmt: skip

    def setup_of(name: str, index: int) -> Setup:
        overrides = ctx.overrides(name, f"throughput-{index}")
        return replace(base, workdir=base.workdir / name, overrides=overrides)

    say("store: bronze throughput")
    runs, produced = alternating_runs(base, STORES, plan.records, plan.repeats, setup_of)
    metrics = ("records_per_second", "steady_records_per_second", "cold_start_seconds",
               "wall_seconds", "cpu_seconds")  # fmt: skip
    return {
        "payload_bytes_per_record": produced.payload_bytes / produced.records,
        "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()},
        "summary": {
            name: {m: stats([float(getattr(r, m)) for r in rs]) for m in metrics}
            for name, rs in runs.items()
        },
    }


# --------------------------------------------------------------------------- 2. latency


def measure_latency(ctx: Context, plan: StorePlan) -> dict[str, Any]:
    latency_plan = LatencyPlan((plan.rate,), plan.seconds, plan.warmup, plan.interval_ms,
                               plan.table_rows, ("conflux",))  # fmt: skip
    results = {}
    for name in STORES:
        say(f"store: produce → visible in bronze on {name}")
        result = run_runner("conflux", latency_plan, ctx.workdir / "store-latency", ctx.jars_dir,
                            ctx.bootstrap, ctx.overrides(name, "latency"), f"_{name}")  # fmt: skip
        phase = result["phases"][0]
        if not phase["latencies_ms"]:
            raise BenchError(f"store latency on {name}: no measured event became visible")
        results[name] = {
            **phase["latencies_ms"],
            "kept_up": phase["kept_up"],
            "events": phase["rows_seen"],
            "commits": phase["commits"],
            "peak_rss_mb": result["peak_rss_mb"],
        }
        say(
            f"  p50 {phase['latencies_ms']['p50']:,.0f} ms, p99 {phase['latencies_ms']['p99']:,.0f} ms"
        )
    return results


# --------------------------------------------------------------------------- 3. Delta commits


@dataclass(frozen=True)
class CommitPlan:
    local_table: str
    store_table: str
    commits: int
    warmup: int
    rows: int


def measure_commits(ctx: Context, plan: StorePlan) -> dict[str, Any]:
    store_table = f"s3a://{ctx.store.bucket}/commits/append_table"
    commit_plan = CommitPlan(str(ctx.workdir / "store-commits" / "append_table"), store_table,
                             plan.appends, 3, plan.append_rows)  # fmt: skip
    say(f"store: {plan.appends} small Delta appends to each table, from one Spark session")
    result = run_plan_child("store_commits", commit_plan, ctx.workdir, ctx.jars_dir,
                            COMMITS_RESULT, ctx.store.settings("commits"))  # fmt: skip
    versions = commit_plan.warmup + commit_plan.commits
    for table in (Location.local(commit_plan.local_table),
                  Location.of(store_table, ctx.store.connection)):  # fmt: skip
        _check_appends(table, versions, plan.append_rows)
    seconds = result["seconds"]
    return {
        **{name: stats([s * 1000 for s in seconds[name]]) for name in STORES},
        "s3a_requests": result["s3a_requests"],
        "s3a_requests_per_append": requests_sent(result["s3a_requests"]) / plan.appends,
    }


def requests_sent(counters: dict[str, int]) -> int:
    """HTTP requests S3A sent, from its counters: ``store_io_request`` counts every one; without
    it, the sum of the ``object_*_request`` kinds (``action_http_*`` count some of them again)."""
    if "store_io_request" in counters:
        return counters["store_io_request"]
    return sum(v for k, v in counters.items() if k.startswith("object_"))


def _check_appends(table: Location, versions: int, rows: int) -> None:
    """Every append landed once; on S3 the last commit was a conditional create of Conflux's."""
    from deltalake import DeltaTable

    delta = DeltaTable(str(table), storage_options=table.delta_rs_options())
    count = delta.to_pyarrow_table(columns=["id"]).num_rows
    if delta.version() != versions - 1 or count != versions * rows:
        raise BenchError(f"{table}: version {delta.version()} holding {count} rows; expected "
                         f"{versions - 1} and {versions * rows}")  # fmt: skip
    if table.is_local:
        return
    bucket, key = split_s3(str(table / "_delta_log" / f"{versions - 1:020d}.json"))
    head = table.storage.client.head_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
    if WRITE_ID not in head.get("Metadata", {}):
        raise BenchError(f"{table}: commit {versions - 1} has no {WRITE_ID}: not written by "
                         "Conflux's conditional log store")  # fmt: skip


# --------------------------------------------------------------------------- 4. lease renew


@dataclass
class TimedLeaseStore:
    """A lease store that times each create of a term (the conditional create + a listing)."""

    inner: StoredLeaseStore
    create_seconds: list[float]

    def latest(self) -> LeaseTerm | None:
        return self.inner.latest()

    def create(self, term: LeaseTerm) -> bool:
        started = time.perf_counter()
        created = self.inner.create(term)
        self.create_seconds.append(time.perf_counter() - started)
        return created

    def prune(self, below: int) -> None:
        self.inner.prune(below)


def measure_lease(ctx: Context, plan: StorePlan) -> dict[str, Any]:
    folders = {
        "local": Location.local(ctx.workdir / "store-lease" / "_lease"),
        "store": Location.of(f"s3a://{ctx.store.bucket}/lease/_lease", ctx.store.connection),
    }
    stores = {
        n: TimedLeaseStore(StoredLeaseStore(f.uri, f.storage), []) for n, f in folders.items()
    }
    leases = {n: FlowLease("bench_lease", s, new_owner_id("bench"), duration=3600.0)
              for n, s in stores.items()}  # fmt: skip
    for lease in leases.values():
        lease.acquire()  # on S3 the first create also probes the bucket's conditional writes
    for store in stores.values():
        store.create_seconds.clear()
    renew: dict[str, list[float]] = {name: [] for name in STORES}
    say(f"store: {plan.renews} lease renews on each")
    with counted_requests(folders["store"]) as sent:  # local renews send none
        for index in range(plan.renews):
            for name in order(index):
                started = time.perf_counter()
                leases[name].renew()
                renew[name].append(time.perf_counter() - started)
    result = {
        "renew": {name: stats([s * 1000 for s in renew[name]]) for name in STORES},
        "create": {n: stats([x * 1000 for x in s.create_seconds]) for n, s in stores.items()},
        "s3_requests_per_renew": sent[0] / plan.renews,
    }
    for lease in leases.values():
        lease.release()
    return result


@contextlib.contextmanager
def counted_requests(location: Location) -> Iterator[list[int]]:
    """``[n]``: the requests the boto3 client of ``location`` sent inside the block."""
    client = location.storage.client  # type: ignore[attr-defined]
    sent = [0]

    def seen(**_kwargs: Any) -> None:
        sent[0] += 1

    client.meta.events.register("before-send.s3", seen)
    try:
        yield sent
    finally:
        client.meta.events.unregister("before-send.s3", seen)


# --------------------------------------------------------------------------- the run


def run_store(
    workdir: Path, jars_dir: Path, bootstrap: str, plan: StorePlan, command: str
) -> Outcome:
    data: dict[str, Any] = {"label": LABEL, "plan": asdict(plan), "command": command}
    with own_store(workdir / "s3-runtime", jars_dir) as store:
        data["store"] = {"endpoint": store.connection.endpoint,
                         "start_seconds": round(store.command_seconds, 2)}  # fmt: skip
        ctx = Context(workdir, jars_dir, bootstrap, store)
        steps: dict[str, Callable[[Context, StorePlan], dict[str, Any]]] = {
            "lease": measure_lease,
            "commits": measure_commits,
            "throughput": measure_throughput,
            "latency": measure_latency,
        }
        for name, step in steps.items():
            data[name] = step(ctx, plan)
    data["comparison"] = comparison(data)
    return Outcome(rows(data), data, markdown_table(data), "local disk against the S3 store")


# --------------------------------------------------------------------------- report


def comparison(data: dict[str, Any]) -> list[dict[str, Any]]:
    """(measure, size, unit, local, store, store / local) of every figure."""
    p = data["plan"]
    runs = f"median of {p['repeats']} run{'s' if p['repeats'] > 1 else ''} each"
    sizes = {
        "throughput": f"{p['records']:,} records (3 partitions), commits of "
        f"{p['commit_records']:,}; {runs}",
        "latency": f"{p['rate']:g} events/s for {p['seconds']:g} s after a {p['warmup']:g} s "
        f"warm-up; table ≥ {p['table_rows']:,} rows; trigger every {p['interval_ms']} ms",
        "commits": f"{p['appends']} appends of {p['append_rows']} rows each, one Spark session, "
        "after 3 warm-up appends",
        "lease": f"{p['renews']} renews each",
    }
    behind = [name for name in STORES if not data["latency"][name]["kept_up"]]
    if behind:
        sizes["latency"] += f"; did NOT catch up on {' and '.join(behind)}: events seen only"
    t, lat = data["throughput"]["summary"], data["latency"]
    lines = [
        ("bronze throughput, exec → exit", "throughput", "records/s", "{:,.0f}",
         t["local"]["records_per_second"]["median"], t["store"]["records_per_second"]["median"]),
        ("bronze throughput, steady state", "throughput", "records/s", "{:,.0f}",
         t["local"]["steady_records_per_second"]["median"],
         t["store"]["steady_records_per_second"]["median"]),
        ("bronze cold start (exec → first commit)", "throughput", "s", "{:.1f}",
         t["local"]["cold_start_seconds"]["median"], t["store"]["cold_start_seconds"]["median"]),
        ("produce → visible in bronze, p50", "latency", "ms", "{:,.0f}",
         lat["local"]["p50"], lat["store"]["p50"]),
        ("produce → visible in bronze, p99", "latency", "ms", "{:,.0f}",
         lat["local"]["p99"], lat["store"]["p99"]),
        ("small Delta append from Spark, median", "commits", "ms", "{:,.0f}",
         data["commits"]["local"]["median"], data["commits"]["store"]["median"]),
        ("small Delta append from Spark, p90", "commits", "ms", "{:,.0f}",
         data["commits"]["local"]["p90"], data["commits"]["store"]["p90"]),
        ("lease renew (FlowLease.renew), median", "lease", "ms", "{:.2f}",
         data["lease"]["renew"]["local"]["median"], data["lease"]["renew"]["store"]["median"]),
        ("lease term create (StoredLeaseStore.create), median", "lease", "ms", "{:.2f}",
         data["lease"]["create"]["local"]["median"], data["lease"]["create"]["store"]["median"]),
    ]  # fmt: skip
    return [
        {"measure": m, "size": sizes[kind], "unit": unit, "format": form, "local": local,
         "store": store, "ratio": store / local if local else float("nan")}
        for m, kind, unit, form, local, store in lines
    ]  # fmt: skip


def rows(data: dict[str, Any]) -> list[Row]:
    return side_by_side_rows("store", data, STORES, ("local disk", "S3 store"), f"store: {LABEL}")


def markdown_table(data: dict[str, Any]) -> str:
    """The side-by-side table (BENCHMARKS.md's section and the run's Markdown block)."""
    lines = side_by_side_table(data, STORES, ("local disk", "S3 store"))
    commits, lease = data["commits"], data["lease"]
    lines += [
        "",
        f"\\* {LABEL}. The store is the benchmark's own s3proxy ({data['store']['endpoint']}, "
        "filesystem backend), sharing the machine's CPU with the flow. Requests sent to it: "
        f"{commits['s3a_requests_per_append']:.1f} per small append (S3A's counters by kind are "
        f"in the JSON), {lease['s3_requests_per_renew']:.1f} per lease renew. A real object store "
        "typically takes tens of milliseconds per request: those counts, not these ratios, say "
        "what it would cost.",
        "",
        f"Command: `{data['command']}`",
    ]
    return "\n".join(lines)

"""Where a silver batch's time goes: its phases, timed in the driver, beside Spark's job counts.

``python -m bench.silver_phases --bootstrap HOST:PORT`` runs, in this process's own Spark session
(``pipelines.runner.run_flows``, local mode), a Debezium flow (bronze + silver fused into bronze's
batch, a current-state table keyed by ``id``, with ``--history`` a history table too): first an
initial load of ``--keys`` inserts in one batch, then ``--batches`` batches of ``--batch`` updates
over the same keys. Each phase of the stage (:class:`pipelines.stages.silver.SilverStage`) is
timed around its method; Spark's event log, read afterwards, says how many jobs ran and how long
Delta spent reconstructing table snapshots ("Compute snapshot" jobs). One line per batch and a
summary; ``--json FILE`` writes them. Producer, broker and Spark share this machine.

It patches the stage's methods in this process only, to time them, and with ``--reader-option``
the options Conflux gives Spark's Kafka reader: a measurement, not a runner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer

from bench.harness import PROJECT_ROOT, bench_settings, say
from bench.orders import create_topic
from bench.silver_latency import KEY_POOL, SCHEMA_DDL, change_event
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.sources import kafka as kafka_source
from pipelines.spark import get_spark_session
from pipelines.spec import load_spec
from pipelines.stages import bronze as bronze_stage
from pipelines.stages import silver as silver_stage

CURRENT_PHASE = "current: reduce + MERGEs"
#: (method of SilverStage, phase name): the phases timed, outermost first.
PHASES = (
    ("write_batch", "batch"),
    ("_parse", "parse: plan"),
    ("_count", "count"),
    ("_without_redelivered", "re-sent changes: lookup + hold"),
    ("_append", "appends"),
    ("_merge", CURRENT_PHASE),
    ("_merge_history", "history: recompute + MERGE"),
)
SNAPSHOT_JOBS = "Compute snapshot"
HOLD_PHASE = "parse: compute + hold"
WHOLE_PHASE = "bronze + silver"
#: Seconds from the start of the query's batch to the end of the current table's MERGEs (what a
#: reader waits for, beside the wait for the batch to start; an upper bound in a batch with
#: deletes, whose deleted-keys MERGE follows the current table's).
CURRENT_VISIBLE = "current committed after"
COMPILES = "compiles"


def compilations(spark: Any) -> Callable[[], int]:
    """How many classes Spark's code generator has compiled in this JVM so far (a cache miss
    each: a plan whose generated source differs from every cached one, e.g. by a literal)."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return lambda: int(metrics.METRIC_COMPILATION_TIME().getCount())


class PhaseClock:
    """Seconds spent in each phase, per batch (the ``batch`` phase starts a new one), and the
    classes Spark generated and compiled during each batch (``compiles``: a batch whose plans
    were all compiled before compiles none)."""

    def __init__(self, compiled: Callable[[], int] = lambda: 0) -> None:
        self.batches: list[dict[str, float]] = []
        self.open: list[str] = []
        self.compiled = compiled
        self.query_batch_started = 0.0

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        if phase == "batch":
            self.batches.append(defaultdict(float))
        elif not self.batches:  # the stage designing its tables at start: not a batch
            yield
            return
        started, compiled = time.perf_counter(), self.compiled() if phase == "batch" else 0
        self.open.append(phase)
        try:
            yield
        finally:
            self.open.pop()
            self.batches[-1][phase] += time.perf_counter() - started
            if phase == "batch":
                self.batches[-1][COMPILES] += self.compiled() - compiled

    def patch(self) -> None:
        for method, phase in PHASES:
            original = getattr(silver_stage.SilverStage, method)
            setattr(silver_stage.SilverStage, method, self._timed(original, phase))
        hold = silver_stage.hold

        def held(frame: Any) -> Any:
            """The batch's own hold (the parse computed and kept) is a phase; the holds inside
            the MERGE phases are part of those."""
            if self.open != ["batch"]:
                return hold(frame)
            with self.timing(HOLD_PHASE):
                return hold(frame)

        silver_stage.hold = held
        write_with = bronze_stage.BronzeStage.write_with

        def whole(*args: Any, **kwargs: Any) -> Any:
            """The query's whole batch: bronze's append and the silver stage fused into it."""
            started = self.query_batch_started = time.perf_counter()
            try:
                return write_with(*args, **kwargs)
            finally:
                if self.batches:
                    self.batches[-1][WHOLE_PHASE] += time.perf_counter() - started

        bronze_stage.BronzeStage.write_with = whole  # type: ignore[method-assign]

    def _timed(self, original: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(phase):
                returned = original(*args, **kwargs)
            if phase == CURRENT_PHASE and self.batches:  # readers see the batch from here on
                self.batches[-1][CURRENT_VISIBLE] = time.perf_counter() - self.query_batch_started
            return returned

        return timed


def flow_document(
    topic: str, history: bool, per_trigger: int, table_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The measured flow's spec; ``table_options`` go on its current and history tables."""
    options = table_options or {}
    silver: dict[str, Any] = {
        "format": "debezium",
        "schema": SCHEMA_DDL,
        "chaining": "bronze_batch",
        "current": {"table": "phases_current", "keys": ["id"], **options},
    }
    if history:
        silver["history"] = {"table": "phases_history", **options}
    return {
        "name": "phases",
        "source": {"kind": "kafka", "topics": [topic], "max_offsets_per_trigger": per_trigger},
        "target": {"table": "bronze_phases"},
        "silver": silver,
    }


def patch_reader(extra: dict[str, str]) -> None:
    """Spark's Kafka reader gets ``extra`` beside the options the flow's spec gives it (in this
    process only: the spec lets only ``kafka.*`` client options through)."""
    if not extra:
        return
    given = kafka_source.reader_options

    def reader_options(*args: Any, **kwargs: Any) -> dict[str, str]:
        return {**given(*args, **kwargs), **extra}

    kafka_source.reader_options = reader_options


def event_index(number: int, keys: int) -> int:
    """The :func:`change_event` index of the run's event ``number``: the first ``keys`` insert
    keys, each later one updates one of them in turn (same key, op ``u``, a higher lsn)."""
    if number < keys:
        return number
    rounds, key = divmod(number - keys, keys)
    return KEY_POOL * (1 + rounds) + key


def produce(bootstrap: str, topic: str, first: int, count: int, keys: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    now = time.time()
    for number in range(first, first + count):
        _, key, value = change_event(event_index(number, keys), now)
        producer.produce(topic, key=key, value=value, partition=number % partitions)
        if number % 10_000 == 0:
            producer.poll(0)
    producer.flush()


def spark_jobs(events_dir: Path, since_ms: float) -> dict[str, float]:
    """Jobs started after ``since_ms`` in the event log: how many, and the seconds of those that
    reconstructed a Delta snapshot."""
    [log_dir] = list(events_dir.iterdir())
    parts = sorted(log_dir.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
    text = b"".join(
        subprocess.run(["zstd", "-dcq", str(p)], capture_output=True, check=True).stdout
        for p in parts
    )
    started: dict[int, tuple[float, bool]] = {}
    snapshot_ms = 0.0
    for line in text.splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerJobStart" and event["Submission Time"] >= since_ms:
            description = event.get("Properties", {}).get("spark.job.description") or ""
            started[event["Job ID"]] = (event["Submission Time"], SNAPSHOT_JOBS in description)
        elif event["Event"] == "SparkListenerJobEnd" and event["Job ID"] in started:
            begun, snapshot = started[event["Job ID"]]
            if snapshot:
                snapshot_ms += event["Completion Time"] - begun
    return {"jobs": len(started), "snapshot_seconds": round(snapshot_ms / 1000, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="conflux-bench-phases-"))
    events_dir = workdir / "events"
    events_dir.mkdir()
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events_dir)}
    conf.update(dict(item.split("=", 1) for item in args.conf))
    settings = bench_settings(workdir, args.jars, args.bootstrap, spark_conf=conf)
    topic = f"bench_phases_{int(time.time())}"
    create_topic(args.bootstrap, topic, partitions=args.partitions)
    spec_file = workdir / "flows" / "phases.yaml"
    spec_file.parent.mkdir(parents=True)
    spark = get_spark_session("bench-silver-phases", settings, ui=False)
    clock = PhaseClock(compilations(spark))
    clock.patch()
    plan = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results: dict[str, Any] = {"plan": plan}
    options = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.table_option)}
    patch_reader(dict(o.split("=", 1) for o in args.reader_option))
    try:
        for label, first, count, per_trigger in (
            ("initial load", 0, args.keys, args.keys),
            ("updates", args.keys, args.batch * args.batches, args.batch),
        ):
            spec_file.write_text(
                yaml.safe_dump(flow_document(topic, args.history, per_trigger, options))
            )
            produce(args.bootstrap, topic, first, count, args.keys, args.partitions)
            clock.batches.clear()
            since_ms, started = time.time() * 1000, time.perf_counter()
            code = run_flows([load_spec(spec_file)], settings, Reporter(), StopRequest(None),
                             "available_now", spark=spark)  # fmt: skip
            assert code == EXIT_OK, f"{label}: exit {code}"
            results[label] = {
                "events": count,
                "seconds": round(time.perf_counter() - started, 1),
                "batches": [{k: round(v, 2) for k, v in b.items()} for b in clock.batches],
                **spark_jobs(events_dir, since_ms),
            }
            say(f"silver_phases: {label}: {json.dumps(results[label])}")
    finally:
        spark.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="a Kafka broker (make broker-start)")
    parser.add_argument("--keys", type=int, default=20_000, help="inserts of the initial load")
    parser.add_argument("--batch", type=int, default=2_500, help="updates per measured batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--history", action="store_true", help="a history table too")
    parser.add_argument(
        "--partitions",
        type=int,
        default=3,
        help="the topic's partitions (a topic the broker creates itself has 1)",
    )
    parser.add_argument(
        "--reader-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of Spark's Kafka reader, beside the flow's (repeatable), e.g. "
        "minPartitions=6: a lever to measure",
    )
    parser.add_argument("--jars", type=Path, default=PROJECT_ROOT / ".runtime" / "jars")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark conf for the session (repeatable): a lever to measure",
    )
    parser.add_argument(
        "--table-option",
        action="append",
        default=[],
        metavar="FIELD=YAML",
        help="a spec field of the current and history tables (repeatable), "
        "e.g. change_data_feed=false",
    )
    args = parser.parse_args()
    if args.partitions < 1:
        parser.error("--partitions: at least 1")
    if not 0 < args.keys <= KEY_POOL:
        parser.error(f"--keys: 1 to {KEY_POOL:,} (the key pool of bench/silver_latency.py)")
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

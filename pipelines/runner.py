"""The stream runner: one Spark application running one or several flows into bronze.

Run it with ``spark-submit pipelines/runner.py --spec flows/orders.yaml [--spec ...]`` (what the
Dagster launcher does) or ``python -m pipelines.runner ...`` for an embedded run.

* ``available_now`` flows run until they have caught up with their source, then the runner exits 0.
* ``continuous`` flows run until stopped: SIGTERM / SIGINT, or the stop file (``--stop-file``)
  appearing, which also works where signals do not reach the driver (a cluster). The runner then
  waits for each query's in-flight micro-batch to commit, stops the queries and exits 0.
* If any query fails, the runner stops the others and exits 1, so a failed Spark job never looks
  like a success; the Spark error is printed to stderr (and to Dagster's logs under Pipes).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.errors import ConfigError
from pipelines.locations import FlowLocations
from pipelines.progress import ProgressTracker
from pipelines.reporting import Reporter, open_reporter
from pipelines.settings import Settings, load_settings
from pipelines.sinks.bronze import start_bronze_query
from pipelines.spark import get_spark_session
from pipelines.spec import TRIGGER_MODES, FlowSpec, load_spec

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
POLL_SECONDS = 0.5


class StopRequest:
    """Set by SIGTERM / SIGINT or by the stop file appearing."""

    def __init__(self, stop_file: Path | None) -> None:
        self._event = threading.Event()
        self._stop_file = stop_file
        self.reason = ""

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.reason = signal.Signals(signum).name
        self._event.set()

    @property
    def requested(self) -> bool:
        if not self._event.is_set() and self._stop_file is not None and self._stop_file.exists():
            self.reason = f"stop file {self._stop_file}"
            self._event.set()
        return self._event.is_set()


def last_batch_id(query: StreamingQuery) -> int:
    progress = query.lastProgress
    return -1 if progress is None else int(progress["batchId"])


def stop_after_inflight_batch(query: StreamingQuery, timeout: float = 120.0) -> None:
    """Stop ``query`` once the micro-batch running now has committed.

    A batch the query starts after that is interrupted, uncommitted, and replayed on restart.
    """
    if query.isActive and query.status.get("isTriggerActive"):
        inflight = last_batch_id(query) + 1
        deadline = time.monotonic() + timeout
        while query.isActive and last_batch_id(query) < inflight and time.monotonic() < deadline:
            time.sleep(0.1)
    query.stop()


def first_failure(queries: dict[str, StreamingQuery]) -> tuple[str, str] | None:
    for name, query in queries.items():
        if not query.isActive:
            error = query.exception()
            if error is not None:
                return name, str(error)
    return None


def supervise(queries: dict[str, StreamingQuery], stop: StopRequest, reporter: Reporter) -> int:
    """Wait until the queries end, fail, or a stop is requested; return the exit code."""
    while True:
        failure = first_failure(queries)
        if failure is not None:
            name, error = failure
            reporter.error(f"flow {name} failed: {error}")
            for query in queries.values():
                if query.isActive:
                    stop_after_inflight_batch(query)
            return EXIT_FAILED
        if all(not q.isActive for q in queries.values()):
            return EXIT_OK
        if stop.requested:
            reporter.info(f"stopping gracefully ({stop.reason}) after the in-flight batches commit")
            for query in queries.values():
                stop_after_inflight_batch(query)
            return EXIT_OK
        time.sleep(POLL_SECONDS)


def run_flows(
    specs: list[FlowSpec],
    settings: Settings,
    reporter: Reporter,
    stop: StopRequest,
    trigger_mode: str | None = None,
    spark: SparkSession | None = None,
) -> int:
    """Run ``specs`` in one Spark application and report their progress; return the exit code."""
    spark = spark or get_spark_session("conflux-" + "-".join(s.name for s in specs), settings)
    table_paths = {s.name: str(FlowLocations.of(s, settings).table) for s in specs}
    tracker = ProgressTracker(spark, table_paths, reporter)
    spark.streams.addListener(tracker)
    try:
        queries = {s.name: start_bronze_query(spark, s, settings, trigger_mode) for s in specs}
        reporter.info(f"started flows {', '.join(queries)}")
        code = supervise(queries, stop, reporter)
        for name, query in queries.items():
            if query.lastProgress is not None:
                tracker.wait_for_batch(name, int(query.lastProgress["batchId"]))
    finally:
        spark.streams.removeListener(tracker)
    if code == EXIT_OK:
        reporter.finished([t.summary() for t in tracker.totals.values()])
    return code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run Conflux flows into bronze Delta tables.")
    parser.add_argument("--spec", action="append", required=True, type=Path, help="flow spec YAML")
    parser.add_argument("--trigger", choices=TRIGGER_MODES, help="override the specs' trigger mode")
    parser.add_argument("--stop-file", type=Path, help="stop gracefully when this file appears")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = StopRequest(args.stop_file)
    stop.install_signal_handlers()
    with ExitStack() as stack:
        reporter = open_reporter(stack)
        try:
            specs = [load_spec(p) for p in args.spec]
            code = run_flows(specs, load_settings(), reporter, stop, args.trigger)
        except ConfigError as exc:
            reporter.error(str(exc))
            raise SystemExit(EXIT_CONFIG) from exc
        if code != EXIT_OK:
            raise SystemExit(code)  # under Pipes, closing the context reports the failure
    return code


if __name__ == "__main__":
    sys.exit(main())

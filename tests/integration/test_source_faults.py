"""Source faults on the real broker and the real Spark: what bronze does when the Kafka side misbehaves.

* a record of 5 MB (the broker accepts up to 8 MB, see ``platform/kafka/broker.py``) lands byte for
  byte, as read by Spark and, independently, by delta-rs (the ``deltalake`` package);
* partitions added to a topic while a continuous flow runs are read from their first offset (the
  flow's first batch is held while they are added and filled, so Spark finds records waiting);
* a deleted topic fails the run, whether it was deleted between runs or during one, and nothing that
  was already committed is duplicated;
* a broker restart in the middle of a continuous run: the stream recovers by itself, and every record
  lands exactly once;
* and the other side: the bronze table's disk fills up (a tmpfs of 8 MB, root only) under a run
  that writes 12 MB: the flow stops as ``disk_full`` naming the volume, and its committed batch is
  whole.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.messages import FlowStopped, StopReason
from pipelines.progress import BatchCommit, BatchProgress, ProgressTracker
from pipelines.reporting import PROGRESS_PREFIX, Reporter
from pipelines.run_state import Phase, flow_run_state
from pipelines.runner import EXIT_FAILED, EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec, parse_spec
from pipelines.status import FlowStatus
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.delta_read import delta_table
from tests.support.disk import tmpfs
from tests.support.kafka import (
    LARGE_RECORD_PRODUCER_CONFIG,
    LARGE_RECORD_TOPIC_CONFIG,
    add_partitions,
    create_topic,
    delete_topic,
    end_offsets,
    order_payloads,
    produce,
    wait_topic_deleted,
)
from tests.support.runner import CliProcess, wait_until
from tests.support.runtime import KafkaBroker, ServiceCli, settings_env

#: What Spark 4.1.3 reports when a subscribed topic no longer exists. Its Kafka source plans each
#: micro-batch by describing the subscribed topics with an admin client
#: (``SubscribeStrategy.assignedTopicPartitions``, from ``KafkaMicroBatchStream.latestOffset``);
#: the broker answers UNKNOWN_TOPIC_OR_PARTITION, Spark retries three times a second apart
#: (``fetchOffset.numRetries``) and fails the query. It never reaches its ``failOnDataLoss``
#: check, so the failure does not depend on that option.
DELETED_TOPIC_ERROR = (
    "org.apache.kafka.common.errors.UnknownTopicOrPartitionException: "
    "This server does not host this topic-partition."
)


class RecordingReporter(Reporter):
    """A real reporter that also keeps the batches and errors it reported, for assertions."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []
        self.batches: list[BatchProgress] = []
        self.stops: list[FlowStopped] = []

    def error(self, message: str) -> None:
        super().error(message)
        self.errors.append(message)

    def stopped(self, stopped: FlowStopped) -> None:
        super().stopped(stopped)
        self.stops.append(stopped)

    def batch(self, progress: BatchProgress) -> None:
        super().batch(progress)
        self.batches.append(progress)

    @property
    def rows(self) -> int:
        return sum(b.input_rows for b in list(self.batches))


class BackgroundFlow:
    """``run_flows`` on the shared session in a thread, stopped through its stop file."""

    def __init__(
        self, spec: FlowSpec, settings: Settings, spark: SparkSession, stop_file: Location
    ):
        self.reporter = RecordingReporter()
        self._stop_file = stop_file
        self.code: int | None = None
        self.error: BaseException | None = None
        stop = StopRequest(stop_file)

        def run() -> None:
            try:
                self.code = run_flows([spec], settings, self.reporter, stop, spark=spark)
            except BaseException as exc:  # surfaced by finish()
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"flow-{spec.name}", daemon=True)

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.thread.is_alive(), f"the flow ended ({self.code}) before {what}"
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
            time.sleep(0.2)

    def join(self, timeout: float) -> int:
        """Wait for the flow to end by itself; return its exit code."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the flow still runs after {timeout:.0f} s"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code

    def finish(self, timeout: float = 180) -> int:
        """Request a graceful stop and wait for it; return the exit code."""
        self._stop_file.touch()
        return self.join(timeout)


@contextmanager
def background_flow(
    spec: FlowSpec, settings: Settings, spark: SparkSession, tmp_path: Path
) -> Iterator[BackgroundFlow]:
    flow = BackgroundFlow(spec, settings, spark, Location.local(tmp_path / f"{spec.name}.stop"))
    flow.thread.start()
    try:
        yield flow
    finally:  # whatever happened, never leave a query running on the shared session
        flow._stop_file.touch()
        flow.thread.join(180)


def kafka_spec(name: str, topic: str, trigger: dict[str, str] | None = None, **source: Any):
    spec: dict[str, Any] = {
        "name": name,
        "source": {"kind": "kafka", "topics": [topic], **source},
        "target": {"table": f"bronze_{name}"},
    }
    if trigger:
        spec["trigger"] = trigger
    return parse_spec(spec)


def table_of(spec: FlowSpec, settings: Settings) -> str:
    return str(FlowState.of(spec, settings).table)


def delta_rows(table: str) -> int:
    """Rows of a bronze table as delta-rs reads it (0 before its first commit)."""
    try:
        return delta_table(table).to_pyarrow_table(columns=["offset"]).num_rows
    except Exception:
        return 0


def assert_every_record_once(spark: SparkSession, table: str, expected: dict[int, int]) -> None:
    """Bronze holds offsets 0 .. end-1 of every partition exactly once (``expected``: ends)."""
    per_partition = {
        r.partition: (r.rows, r.distinct_offsets, r.first, r.last)
        for r in spark.read.format("delta")
        .load(table)
        .groupBy("partition")
        .agg(
            F.count("*").alias("rows"),
            F.countDistinct("offset").alias("distinct_offsets"),
            F.min("offset").alias("first"),
            F.max("offset").alias("last"),
        )
        .collect()
    }
    assert per_partition == {p: (end, end, 0, end - 1) for p, end in expected.items() if end}


class TestLargeRecord:
    def test_a_5_mb_record_lands_byte_for_byte(
        self, spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker
    ) -> None:
        bootstrap, topic = kafka_broker.bootstrap_servers, "large_records"
        create_topic(bootstrap, topic, partitions=1, config=LARGE_RECORD_TOPIC_CONFIG)
        large = (os.urandom(64 * 1024), os.urandom(5 * 1024 * 1024))  # incompressible
        records: list[tuple[bytes | None, bytes | None]] = [
            (b"before", b"small"),
            large,
            (None, b"after"),
        ]
        produce(bootstrap, topic, records, config=LARGE_RECORD_PRODUCER_CONFIG)
        spec = kafka_spec("large_records", topic)

        code = run_flows(
            [spec], spark_settings, RecordingReporter(), StopRequest(None), spark=spark
        )

        assert code == EXIT_OK
        table = table_of(spec, spark_settings)
        rows = spark.read.format("delta").load(table).orderBy("offset").collect()
        by_spark = [(_bytes(r.key), _bytes(r.value)) for r in rows]
        assert [r.offset for r in rows] == [0, 1, 2]
        assert by_spark == records
        by_rs = delta_table(FlowState.of(spec, spark_settings).table)  # delta-rs, not Spark
        arrow = by_rs.to_pyarrow_table().sort_by("offset")
        by_delta_rs = list(zip(arrow["key"].to_pylist(), arrow["value"].to_pylist(), strict=True))
        assert arrow["offset"].to_pylist() == [0, 1, 2]
        assert by_delta_rs == records
        assert len(by_delta_rs[1][1]) == 5 * 1024 * 1024


def _bytes(value: bytes | bytearray | None) -> bytes | None:
    return None if value is None else bytes(value)


class TestPartitionsAdded:
    def test_new_partitions_are_read_from_offset_zero_while_the_flow_runs(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        bootstrap, topic = kafka_broker.bootstrap_servers, "grown_topic"
        create_topic(bootstrap, topic, partitions=2)
        produce(bootstrap, topic, order_payloads(400))
        spec = kafka_spec(topic, topic, trigger={"mode": "continuous", "interval": "1 second"})
        # Spark discovers partitions when it plans a micro-batch. Records must already wait in
        # the new partitions then, or "read from offset 0" and "read from the latest offset"
        # look the same: the first batch is held (see hold_first_batch) while the partitions are
        # added and filled, so the next plan, whenever it comes, finds them non-empty.
        gate = hold_first_batch(monkeypatch, spec.name)

        with background_flow(spec, spark_settings, spark, tmp_path) as flow:
            try:
                flow.wait_until(gate.held.is_set, 300, "first batch")
                add_partitions(bootstrap, topic, 4)
                for partition in (2, 3):
                    produce(
                        bootstrap, topic, order_payloads(150, start=1000 * partition), partition
                    )
                produce(bootstrap, topic, order_payloads(200, start=10_000))  # all four partitions
            finally:  # whatever failed above, the flow goes on (and can stop)
                gate.release.set()
            expected = end_offsets(bootstrap, topic)
            total = sum(expected.values())
            flow.wait_until(lambda: flow.reporter.rows >= total, 300, f"{total} rows")
            assert flow.finish() == EXIT_OK

        assert total == 400 + 300 + 200 and expected[2] >= 150 and expected[3] >= 150
        assert flow.reporter.rows == total
        assert "2" not in flow.reporter.batches[0].end_offsets[topic]  # planned before they existed
        discovered = next(b for b in flow.reporter.batches if "2" in b.end_offsets[topic])
        assert discovered.end_offsets[topic]["2"] > 0  # records were waiting when it was found
        assert_every_record_once(spark, table_of(spec, spark_settings), expected)


@dataclass
class BatchGate:
    """``held`` is set once the flow's first batch waits in its ``foreachBatch``, which goes on
    when ``release`` is set."""

    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def hold_first_batch(monkeypatch: pytest.MonkeyPatch, flow: str) -> BatchGate:
    """Hold ``flow``'s first micro-batch after its Delta write, inside ``foreachBatch``: Spark
    plans the next batch only after this one commits, so whatever the test does until it sets
    ``release`` is seen whole by the next plan, whatever the trigger interval and the machine's
    pace. The hook is :meth:`ProgressTracker.record_commit`, which every stage calls from its
    ``foreachBatch`` before Spark writes the batch's commit-log entry."""
    gate = BatchGate()
    record_commit = ProgressTracker.record_commit

    def record_and_hold(
        tracker: ProgressTracker, commit: BatchCommit, query: str | None = None
    ) -> None:
        record_commit(tracker, commit, query)
        if commit.flow == flow and not gate.release.is_set():
            gate.held.set()
            assert gate.release.wait(300), f"the first batch of {flow} was held for 5 minutes"

    monkeypatch.setattr(ProgressTracker, "record_commit", record_and_hold)
    return gate


class TestDeletedTopic:
    """The subscribed topic is deleted (and not recreated); ``fail_on_data_loss`` is the default."""

    @pytest.mark.parametrize("when", ["between_runs", "while_running"])
    def test_a_deleted_topic_fails_the_run_and_duplicates_nothing(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
        when: str,
    ) -> None:
        bootstrap, topic = kafka_broker.bootstrap_servers, f"deleted_{when}"
        create_topic(bootstrap, topic, partitions=2)
        produce(bootstrap, topic, order_payloads(300))
        expected = end_offsets(bootstrap, topic)
        spec = kafka_spec(topic, topic, trigger={"mode": "continuous", "interval": "1 second"})
        assert spec.source.fail_on_data_loss is True

        if when == "between_runs":
            first = run_flows(
                [spec], spark_settings, Reporter(), StopRequest(None), "available_now", spark=spark
            )
            assert first == EXIT_OK
            delete_topic(bootstrap, topic)
            wait_topic_deleted(bootstrap, topic)
            reporter = RecordingReporter()
            code = run_flows(
                [spec], spark_settings, reporter, StopRequest(None), "available_now", spark=spark
            )
        else:
            with background_flow(spec, spark_settings, spark, tmp_path) as flow:
                flow.wait_until(lambda: flow.reporter.rows >= 300, 120, "first batch")
                delete_topic(bootstrap, topic)
                code = flow.join(timeout=120)  # it fails by itself, nobody asked it to stop
            reporter = flow.reporter

        assert code == EXIT_FAILED
        assert len(reporter.errors) == 1
        assert reporter.errors[0].startswith(f"flow {topic} failed: {DELETED_TOPIC_ERROR}")
        assert [(s.flow, s.reason) for s in reporter.stops] == [(topic, StopReason.SOURCE_ERROR)]
        assert_every_record_once(spark, table_of(spec, spark_settings), expected)


class TestFullDisk:
    def test_a_full_disk_stops_the_flow_as_disk_full_on_its_volume_and_loses_nothing(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
    ) -> None:
        bootstrap, topic = kafka_broker.bootstrap_servers, "full_disk"
        create_topic(bootstrap, topic, partitions=1)
        with tmpfs(tmp_path / "lake", size="8m") as volume:  # the table's; the state is elsewhere
            table = volume / "bronze_full_disk"
            spec = parse_spec(
                {
                    "name": topic,
                    "source": {"kind": "kafka", "topics": [topic]},
                    "target": {"table": "bronze_full_disk", "path": str(table)},
                }
            )
            produce(bootstrap, topic, order_payloads(20))
            first = run_flows(
                [spec], spark_settings, Reporter(), StopRequest(None), "available_now", spark=spark
            )
            assert first == EXIT_OK
            produce(bootstrap, topic, [(None, os.urandom(256 * 1024)) for _ in range(48)])
            reporter = RecordingReporter()
            code = run_flows(
                [spec], spark_settings, reporter, StopRequest(None), "available_now", spark=spark
            )

            assert code == EXIT_FAILED
            [stopped] = reporter.stops
            assert (stopped.flow, stopped.reason) == (topic, StopReason.DISK_FULL)
            assert stopped.message.startswith(
                f"flow {topic} failed: disk full on {volume}: writing {table} failed "
                f"({os.strerror(errno.ENOSPC)}); free space there"
            ), stopped.message
            status_file = FlowState.of(spec, spark_settings).status_file
            recorded = FlowStatus.parse(json.loads(status_file.read_text())).stopped
            assert recorded is not None
            assert (recorded.reason, recorded.message) == (StopReason.DISK_FULL, stopped.message)
            assert spark.read.format("delta").load(str(table)).count() == 20  # batch 0, whole
            state = flow_run_state(spec, spark_settings)  # as conflux status and Dagster say it
            assert state.short == "failed: disk full" and f"disk full on {volume}" in state.summary


#: How long the broker stays down (``make chaos``: 300 s, with the Kafka client's own timeouts);
#: 0 in the suite: down until the supervisor waits for it, its client's timeouts scaled to 3 s.
BROKER_OUTAGE_SECONDS = float(os.environ.get("BROKER_OUTAGE_SECONDS", "0"))
#: Records before the outage (a quarter more after it): 20 000 in make chaos, few in the suite,
#: where size proves nothing more (the outage hits a running query either way).
OUTAGE_RECORDS = 20_000 if BROKER_OUTAGE_SECONDS >= 240 else 4_000


class TestBrokerRestart:
    def test_conflux_run_waits_for_the_broker_and_lands_every_record_once(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        broker_cli: ServiceCli,
        tmp_path: Path,
    ) -> None:
        """``conflux run --continuous``, unattended, through a broker outage longer than its Kafka
        client waits (timeouts scaled down to 3 s; 5 minutes with Spark's own in ``make chaos``,
        ``BROKER_OUTAGE_SECONDS``): the query fails
        with ``source_error``, waits inside its application, probing the broker ("waiting for
        source"), then starts again from its checkpoint once the broker answers: in the same
        application (the lease's owner does not change), with no restart counted."""
        broker_dir = tmp_path / "dedicated-broker"
        started = broker_cli.run("start", "--timeout", "120", runtime_dir=broker_dir)
        assert started.returncode == 0, broker_cli.describe(started)
        state = broker_cli.parse(started)
        bootstrap, topic = state["bootstrap_servers"], "restart_orders"
        cli: CliProcess | None = None
        try:
            create_topic(bootstrap, topic, partitions=3)
            records = order_payloads(OUTAGE_RECORDS)
            produce(bootstrap, topic, records)
            quick = {"kafka.default.api.timeout.ms": "3000", "kafka.request.timeout.ms": "3000"}
            options = quick if BROKER_OUTAGE_SECONDS < 240 else {}  # else Spark's own: ~3 min
            spec_file = write_spec(
                tmp_path / "flows",
                {
                    "name": "broker_restart",
                    "source": {
                        "kind": "kafka",
                        "topics": [topic],
                        "max_offsets_per_trigger": OUTAGE_RECORDS // 4,
                        "options": options,
                        "unavailable_for": "5 minutes",
                    },
                    "target": {"table": "bronze_broker_restart"},
                    "trigger": {"mode": "continuous", "interval": "1 second"},
                },
            )
            spec = load_spec(spec_file)
            settings = replace(spark_settings, kafka_bootstrap_servers=bootstrap)
            env = {**settings_env(settings), "CONFLUX_FLOWS_DIR": str(spec_file.parent)}
            cli = CliProcess(env, tmp_path / "run.log", "run", "broker_restart", "--continuous")
            wait_until(lambda: PROGRESS_PREFIX in cli.output(), 240, "a first batch", cli)
            owner = flow_run_state(spec, settings).owner

            stopped = broker_cli.run("stop", runtime_dir=broker_dir, timeout=90)
            assert stopped.returncode == 0, broker_cli.describe(stopped)
            down_at = time.monotonic()
            waiting = wait_until(
                lambda: [s for s in [flow_run_state(spec, settings)]
                         if s.phase is Phase.WAITING_FOR_SOURCE],
                max(120, BROKER_OUTAGE_SECONDS), "the supervisor to wait for the source", cli,
            )[0]  # fmt: skip
            assert "[source_error]" in waiting.summary, waiting.summary
            assert "flow broker_restart failed: org.apache.kafka." in waiting.summary
            time.sleep(max(0.0, BROKER_OUTAGE_SECONDS - (time.monotonic() - down_at)))
            # As `make broker-start` does: no port given, it comes back where the flow expects it.
            restarted = broker_cli.run("start", "--timeout", "120", runtime_dir=broker_dir)
            assert restarted.returncode == 0, broker_cli.describe(restarted)
            assert broker_cli.parse(restarted)["bootstrap_servers"] == bootstrap
            more = order_payloads(OUTAGE_RECORDS // 4, start=OUTAGE_RECORDS)
            produce(bootstrap, topic, more)
            expected = end_offsets(bootstrap, topic)
            assert sum(expected.values()) == len(records) + len(more)  # the first ones were kept

            # Started again by itself, from the checkpoint: it reaches the records produced now.
            wait_until(
                lambda: (
                    flow_run_state(spec, settings).phase is Phase.RUNNING
                    and delta_rows(table_of(spec, settings)) == len(records) + len(more)
                ),
                240,
                "the flow to run again and catch up",
                cli,
            )
            output = cli.output()
            assert "waiting for the source since" in output and "the source answers again" in output
            assert flow_run_state(spec, settings).owner == owner  # the same application
            assert "restart 1 of" not in output  # an outage ridden out counts no restart
            cli.interrupt()
            assert cli.wait(timeout=180) == EXIT_OK, cli.output()[-5000:]
            assert flow_run_state(spec, settings).phase is Phase.STOPPED

            # Nothing left: one available_now run (in-process: the shared session) finds none.
            final = run_flows(
                [spec], settings, Reporter(), StopRequest(None), "available_now", spark=spark
            )
            assert final == EXIT_OK
            table = table_of(spec, settings)
            assert_every_record_once(spark, table, expected)
            landed = spark.read.format("delta").load(table).select("key", "value").collect()
            assert Counter((bytes(r.key), bytes(r.value)) for r in landed) == Counter(
                records + more
            )
        finally:
            if cli is not None and cli.process.poll() is None:
                cli.kill()
            stop = broker_cli.run("stop", runtime_dir=broker_dir, timeout=90)
            assert stop.returncode == 0, broker_cli.describe(stop)

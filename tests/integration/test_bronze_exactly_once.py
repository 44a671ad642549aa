"""Bronze is exactly once: the application is SIGKILLed where it matters and restarted, and the
table still holds every source record exactly once.

Kafka: the flow runs the way Dagster runs it, a ``spark-submit`` of the runner launched by
:class:`~pipelines.launcher.FlowApplication`, and is killed three times (helpers in
:mod:`tests.support.chaos`, which pause the process group and read the frozen state before each
kill, so where every kill landed is recorded, not guessed):

1. after a batch's Delta commit, before its commit-log entry: on restart the batch is replayed
   and Delta skips it;
2. in the middle of a batch (offsets logged, nothing committed): on restart it runs again and is
   committed once;
3. at random moments (``make chaos``; the suite's schedule stops after 2).

A final ``available_now`` run catches up. ``deltalake`` (delta-rs, independent of Spark) then reads
the table, and the Delta log itself shows every transaction version committed exactly once.

The scale comes from the environment, so the suite runs small and ``make chaos`` can run big:
``CHAOS_RECORDS`` (default 20,000), ``CHAOS_MAX_OFFSETS_PER_TRIGGER`` (2,000),
``CHAOS_RANDOM_KILLS`` (0; 3 under ``CHAOS_FULL_SCHEDULE=1``, which ``make chaos`` sets, as it
sets the file source's kills from 1 to 3); ``KILL_SEED`` replays a kill schedule (printed by
every run).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml
from pyspark.sql import SparkSession

from pipelines.catalog.state import FlowState
from pipelines.launcher import FlowApplication
from pipelines.location import Location
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.support.chaos import (
    AFTER_DELTA_COMMIT,
    FULL_SCHEDULE,
    MID_BATCH,
    Aim,
    ChaosError,
    FinishedRun,
    FlowFiles,
    Landing,
    ProcessGroup,
    RunOutput,
    kill_after_delta_commit,
    kill_mid_batch,
    kill_now,
    seed_from_env,
)
from tests.support.delta_read import delta_table
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runner import RunnerProcess
from tests.support.runtime import KafkaBroker, settings_env

RECORDS = int(os.environ.get("CHAOS_RECORDS", "20000"))
MAX_OFFSETS_PER_TRIGGER = int(os.environ.get("CHAOS_MAX_OFFSETS_PER_TRIGGER", "2000"))
RANDOM_KILLS = int(os.environ.get("CHAOS_RANDOM_KILLS", "3" if FULL_SCHEDULE else "0"))
#: Pauses allowed to aim for a window before the test gives up (each pause costs one batch).
TRIES = 5
#: The file-source test's kills, each at a random moment after a batch was reported.
KILLS = 3 if FULL_SCHEDULE else 1
REPLAY_LOG = "was a replay of a batch Delta had already committed; Delta skipped it"


def write_spec(folder: Path, spec: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@dataclass
class Launches:
    """Starts the flow's application again and again, as Dagster would, each with its own logs."""

    spec: FlowSpec
    settings: Settings
    logs: Path
    timings: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def run(self, name: str, trigger: str) -> Iterator[tuple[ProcessGroup, RunOutput]]:
        """A FlowApplication; leaving it stops the application if it still runs, frees the lease."""
        output = RunOutput(self.logs / f"{name}.out", self.logs / f"{name}.err")
        started = time.monotonic()
        with output.stdout.open("wb") as stdout, output.stderr.open("wb") as stderr:
            application = FlowApplication(
                [self.spec],
                self.settings,
                trigger=trigger,
                owner_kind="test",
                stdout=stdout,
                stderr=stderr,
            )
            with application:
                assert application.process is not None
                yield ProcessGroup(application.process), output
        self.timings.append((name, round(time.monotonic() - started, 1)))

    def catch_up_here(
        self, spark: SparkSession, spec: FlowSpec | None = None
    ) -> tuple[FinishedRun, RunOutput]:
        """The final ``available_now`` run, in the suite's own Spark session rather than a new
        application: the same checkpoints, tables and lease (taken over from the killed owner),
        what it prints kept in a :class:`RunOutput` as an application's would be, so the same
        checks read it. A kill is what needs a process of its own; the catch-up does not.

        ``spec``: the same flow with other batch limits (a catch-up needs no small batches to
        kill in); a batch the killed run planned replays with the offsets its log recorded."""
        output = RunOutput(self.logs / "final.out", self.logs / "final.err")
        started = time.monotonic()
        with (
            output.stdout.open("w") as stdout,
            output.stderr.open("w") as stderr,
            redirect_stdout(stdout),
            redirect_stderr(stderr),
        ):
            code = run_flows(
                [spec or self.spec], self.settings, Reporter(), StopRequest(None), "available_now",
                spark=spark,
            )  # fmt: skip
        self.timings.append(("final (in-process)", round(time.monotonic() - started, 1)))
        return FinishedRun(code), output


def check_restart(
    landing: Landing, files: FlowFiles, group: ProcessGroup | FinishedRun, out: RunOutput
) -> None:
    """What the run after ``landing`` must show for the killed batch (if the kill hit one)."""
    batch = landing.batch_id
    if landing.kind == AFTER_DELTA_COMMIT:
        progress = out.wait_for_batch(group, batch)
        assert progress["replayed"] is True, progress
        assert progress["rows_added"] == 0, progress
        deadline = time.monotonic() + 30  # the log line follows the progress line
        while f"batch {batch} {REPLAY_LOG}" not in out.text():
            assert time.monotonic() < deadline, f"no replay log line for batch {batch}"
            time.sleep(0.1)
    elif landing.kind == MID_BATCH:
        progress = out.wait_for_batch(group, batch)
        assert progress["replayed"] is False, progress
        assert progress["rows_added"] == progress["input_rows"] > 0, progress
    else:
        return
    commits = files.delta_commits_of_batch(batch)
    assert len(commits) == 1, f"batch {batch} ({landing}) is in Delta commits {commits}"
    assert files.batch_committed(batch)


class TestKafkaBronzeExactlyOnce:
    def test_sigkill_in_the_commit_window_and_mid_batch(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
    ) -> None:
        seed = seed_from_env()
        print(f"\nkill schedule seed: KILL_SEED={seed}")
        rng = random.Random(seed)
        topic = "exactly_once_orders"
        create_topic(kafka_broker.bootstrap_servers, topic, partitions=3)
        records = order_payloads(RECORDS)
        produce(kafka_broker.bootstrap_servers, topic, records)

        def eo_spec(max_offsets_per_trigger: int | None) -> FlowSpec:
            source = {"kind": "kafka", "topics": [topic]}
            if max_offsets_per_trigger:
                source["max_offsets_per_trigger"] = max_offsets_per_trigger
            flow = {
                "name": "eo_kafka",
                "source": source,
                "target": {"table": "bronze_eo_kafka"},
                "trigger": {"mode": "continuous", "interval": "1 second"},
            }
            return load_spec(write_spec(tmp_path / "flows", flow))

        spec = eo_spec(MAX_OFFSETS_PER_TRIGGER)
        settings = replace(
            spark_settings, spark_conf={"spark.ui.enabled": "false", **spark_settings.spark_conf}
        )
        files = FlowFiles.of(spec, settings)
        launches = Launches(spec, settings, tmp_path)
        window, mid_batch = Aim(AFTER_DELTA_COMMIT), Aim(MID_BATCH)
        landings: list[Landing] = []

        def report() -> None:
            print(f"kills landed: {[(k.kind, k.batch_id) for k in landings]}")
            for aim in (window, mid_batch):
                print(f"  {aim.rate()}; misses (where the pause found the flow): {aim.misses}")
            print(f"  runs (name, seconds): {launches.timings}  KILL_SEED={seed}")

        try:
            with launches.run("run-0", "continuous") as (group, out):
                landings.append(kill_after_delta_commit(group, files, window, TRIES))
            with launches.run("run-1", "continuous") as (group, out):
                check_restart(landings[-1], files, group, out)
                delay = lambda: rng.uniform(0.0, 0.3)  # noqa: E731
                landings.append(kill_mid_batch(group, files, mid_batch, delay, TRIES))
            for kill in range(RANDOM_KILLS):
                with launches.run(f"run-{2 + kill}", "continuous") as (group, out):
                    check_restart(landings[-1], files, group, out)
                    time.sleep(rng.uniform(0.0, 3.0))
                    assert group.running(), out.tail()
                    landings.append(kill_now(group, files))
            # the rest at once: the killed batch first, with the offsets its log recorded
            finished, out = launches.catch_up_here(spark, eo_spec(None))
            assert finished.code == EXIT_OK, out.tail()
            check_restart(landings[-1], files, finished, out)
        except ChaosError:
            report()
            raise
        report()

        assert [k.kind for k in landings[:2]] == [AFTER_DELTA_COMMIT, MID_BATCH]
        assert len(landings) == 2 + RANDOM_KILLS

        # The Delta log: every transaction version in exactly one commit, one app id throughout.
        txn_commits = files.txn_commits()
        twice = {key: versions for key, versions in txn_commits.items() if len(versions) != 1}
        assert not twice, f"transaction versions committed more than once: {twice}"
        assert len({app for app, _version in txn_commits}) == 1, sorted(txn_commits)
        assert sorted(v for _app, v in txn_commits) == files.committed_batches()

        # The rows, read by delta-rs: every record once, byte for byte.
        table = delta_table(files.table).to_pyarrow_table(
            columns=["topic", "partition", "offset", "key", "value"]
        )
        assert table.num_rows == RECORDS
        coordinates = table.group_by(["topic", "partition", "offset"]).aggregate([])
        assert coordinates.num_rows == RECORDS
        assert pc.all(pc.equal(table["topic"], topic)).as_py()
        landed = Counter(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))
        assert landed == Counter(records)


def rows_committed(files: FlowFiles) -> int:
    """Rows the table's commits wrote so far, from the Delta log (no Spark)."""
    rows = 0
    for version in files.delta_versions():
        for action in files.delta_commit(version):
            metrics = action.get("commitInfo", {}).get("operationMetrics", {})
            rows += int(metrics.get("numOutputRows", 0))
    return rows


def crash_and_restart(
    spec_file: Path, settings: Settings, logs: Path, spark: SparkSession
) -> Location:
    """Run the flow continuously, SIGKILL it at random moments, let it catch up; return the table.

    The killed runs are separate processes (a kill is what is tested); the catch-up runs
    in-process on ``spark``, from the same checkpoint, which saves a Spark application's start.
    """
    seed = seed_from_env()
    print(f"kill schedule seed: KILL_SEED={seed}")
    rng = random.Random(seed)
    env = settings_env(settings)
    spec = load_spec(spec_file)
    locations = FlowState.of(spec, settings)
    files = FlowFiles(locations.table, locations.checkpoint)
    for attempt in range(KILLS):
        runner = RunnerProcess(
            [spec_file], env, logs / f"run-{attempt}.log", "--trigger", "continuous"
        )
        # A batch to kill, unless earlier runs ingested everything: then nothing comes (a run
        # that has caught up is killed all the same, after its start).
        deadline = time.monotonic() + 240
        while runner.progress_lines() < 1 and time.monotonic() < deadline:
            if rows_committed(files) >= RECORDS and runner.output().count("conflux: started"):
                break
            assert runner.process.poll() is None, runner.output()[-3000:]
            time.sleep(0.2)
        assert runner.process.poll() is None, runner.output()[-3000:]
        time.sleep(rng.uniform(0.0, 3.0))  # land the kill anywhere inside the following batches
        runner.kill()  # its own lease stays live; the restart takes it over (owner process gone)
    code = run_flows([spec], settings, Reporter(), StopRequest(None), "available_now", spark=spark)
    assert code == EXIT_OK  # a failure's errors are in the captured output
    return locations.table


class TestFileBronzeExactlyOnce:
    def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
        self, spark: SparkSession, spark_settings: Settings, tmp_path: Path
    ) -> None:
        landing = tmp_path / "landing"
        landing.mkdir()
        per_file = 1000
        for index, start in enumerate(range(0, RECORDS, per_file)):
            lines = [
                json.dumps({"order_id": i, "amount": i * 0.5})
                for i in range(start, min(start + per_file, RECORDS))
            ]
            (landing / f"orders-{index:04d}.json").write_text("\n".join(lines) + "\n")
        spec_file = write_spec(
            tmp_path / "flows",
            {
                "name": "eo_files",
                "source": {
                    "kind": "files",
                    "path": str(landing),
                    "format": "json",
                    "max_files_per_trigger": 6,
                },
                "target": {"table": "bronze_eo_files"},
                "trigger": {"mode": "continuous", "interval": "1 second"},
            },
        )
        table = crash_and_restart(spec_file, spark_settings, tmp_path, spark)
        bronze = spark.read.format("delta").load(str(table))
        ids = Counter(r.order_id for r in bronze.select("order_id").collect())
        assert sum(ids.values()) == RECORDS
        assert ids == Counter(range(RECORDS))
        assert bronze.where("_rescued_data IS NOT NULL").count() == 0


pytestmark = pytest.mark.timeout(1800)  # 2 shared cores: a Spark start can take minutes

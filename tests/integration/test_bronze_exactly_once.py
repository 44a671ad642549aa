"""Bronze is exactly once: the driver is SIGKILLed at random moments and restarted, and the table
still holds every source record exactly once."""

import json
import random
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from pipelines.locations import FlowLocations
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runner import RunnerProcess
from tests.support.runtime import KafkaBroker, settings_env

RECORDS = 100_000
KILLS = 3


def write_spec(folder: Path, spec: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def crash_and_restart(spec_file: Path, settings: Settings, logs: Path) -> Path:
    """Run the flow continuously, SIGKILL it at random moments, let it catch up; return the table."""
    seed = random.randrange(1 << 30)
    print(f"kill schedule seed: {seed}")
    rng = random.Random(seed)
    env = settings_env(settings)
    for attempt in range(KILLS):
        runner = RunnerProcess(
            [spec_file], env, logs / f"run-{attempt}.log", "--trigger", "continuous"
        )
        runner.wait_for_progress(1, timeout=240)
        assert runner.process.poll() is None, runner.output()[-3000:]
        time.sleep(rng.uniform(0.0, 3.0))  # land the kill anywhere inside the following batches
        runner.kill()
    final = RunnerProcess([spec_file], env, logs / "final.log", "--trigger", "available_now")
    assert final.wait(timeout=600) == 0, final.output()[-5000:]
    return FlowLocations.of(load_spec(spec_file), settings).table


class TestKafkaBronzeExactlyOnce:
    def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
    ) -> None:
        topic = "exactly_once_orders"
        create_topic(kafka_broker.bootstrap_servers, topic, partitions=3)
        records = order_payloads(RECORDS)
        produce(kafka_broker.bootstrap_servers, topic, records)
        spec_file = write_spec(
            tmp_path / "flows",
            {
                "name": "eo_kafka",
                "source": {"kind": "kafka", "topics": [topic], "max_offsets_per_trigger": 8000},
                "target": {"table": "bronze_eo_kafka"},
                "trigger": {"mode": "continuous", "interval": "1 second"},
            },
        )
        table = crash_and_restart(spec_file, spark_settings, tmp_path)
        bronze = spark.read.format("delta").load(str(table))
        assert bronze.count() == RECORDS
        assert bronze.select("topic", "partition", "offset").distinct().count() == RECORDS
        landed = Counter(
            (bytes(r.key), bytes(r.value)) for r in bronze.select("key", "value").collect()
        )
        assert landed == Counter(records)


class TestFileBronzeExactlyOnce:
    def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
        self, spark: SparkSession, spark_settings: Settings, tmp_path: Path
    ) -> None:
        landing = tmp_path / "landing"
        landing.mkdir()
        per_file = 1000
        for index in range(RECORDS // per_file):
            lines = [
                json.dumps({"order_id": i, "amount": i * 0.5})
                for i in range(index * per_file, (index + 1) * per_file)
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
        table = crash_and_restart(spec_file, spark_settings, tmp_path)
        bronze = spark.read.format("delta").load(str(table))
        ids = Counter(r.order_id for r in bronze.select("order_id").collect())
        assert sum(ids.values()) == RECORDS
        assert ids == Counter(range(RECORDS))
        assert bronze.where("_rescued_data IS NOT NULL").count() == 0


pytestmark = pytest.mark.timeout(1200)

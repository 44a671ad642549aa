"""Build the JVM class-data archive that cuts the start-up of every Conflux Spark application.

Usage: ``python platform/jvm/class_archive.py [--force]`` (``make setup`` runs it).

A Spark driver with Delta loads ~20,000 classes before its first micro-batch; the JVM parses and
verifies each one on every start. Java's application class-data sharing (AppCDS) keeps them
parsed and verified in a file mapped at start: this script runs a small training flow (Kafka →
bronze → silver events, current state and history → gold, the Conflux runner, with a broker of
its own in a throw-away runtime folder) in a JVM started with
``-XX:ArchiveClassesAtExit`` and keeps what it dumps at exit as ``<jars>/spark-classes.jsa``.
:func:`pipelines.jvm.class_archive_options` then adds ``-XX:SharedArchiveFile`` to every driver.

The archive is only valid for the JDK and the classpath that made it; it is rebuilt when the key
beside it (the ``java -version`` text and the path, size and time of every jar) changes. It is a
speed-up, never a requirement: if it cannot be built, this script warns and exits 0 (drivers then
start without it), and a stale archive is not passed to the JVM at all.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.errors import ConfigError
from pipelines.job_progress import ticking
from pipelines.jvm import (
    ARCHIVE_NAME,
    DUMP_ENV,
    SHORT_RUN_DRIVER_OPTIONS,
    archive_key,
    check_java,
    class_archive,
)
from pipelines.processes import group_pids
from pipelines.profiles import Profile
from pipelines.settings import load_settings, settings_environment

TRAINING_FLOW = {
    "name": "training",
    "source": {"kind": "kafka", "topics": ["training"], "starting_offsets": "earliest"},
    "target": {"table": "bronze_training", "partition_by": ["ingest_date"]},
    "trigger": {"mode": "available_now"},
    "silver": {
        "format": "json",
        "schema": "id BIGINT, product STRING, amount DOUBLE, event_time TIMESTAMP",
        "event_time": "event_time",
        "current": {"table": "training_current", "keys": ["id"], "sequence_by": "event_time"},
        "history": {"table": "training_history"},
    },
    "gold": [
        {
            "table": "training_10m",
            "event_time": "event_time",
            "allowed_lateness": "10 minutes",
            "window": {"duration": "10 minutes"},
            "group_by": ["product"],
            "aggregates": [{"name": "revenue", "function": "sum", "column": "amount"}],
        }
    ],
}
#: The training driver compiles with C1 alone: a short run on 200 events, whose C2 compilations
#: would never pay back (the build took 224 and 216 s against 354 s with C2 on the same slow
#: afternoon, bench/HISTORY.md). The archive holds parsed classes, never compiled code: a driver
#: with both compilers maps it all the same (11,488 of its classes came from it).
TRAINING_JVM = {"spark.driver.defaultJavaOptions": SHORT_RUN_DRIVER_OPTIONS}
TIMEOUT_SECONDS = 600
BROKER_SCRIPT = Path(__file__).resolve().parents[1] / "kafka" / "broker.py"


def produce_training_events(bootstrap: str, count: int = 200) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        event = {"id": i % 50, "product": f"p{i % 4}", "amount": i / 10,
                 "event_time": f"2026-01-01T00:{i % 60:02d}:00Z"}  # fmt: skip
        producer.produce("training", key=str(i % 50).encode(), value=json.dumps(event).encode())
    if producer.flush(60) != 0:
        raise ConfigError("could not produce the training events to the training broker")


def _broker(env: dict[str, str], action: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(BROKER_SCRIPT), action, "--timeout", "120"]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def train(archive: Path, runtime: Path) -> None:
    """Run the training flow in a JVM that dumps its loaded classes to ``archive`` at exit."""
    import yaml

    settings = replace(
        load_settings(profile=Profile.LOCAL),
        runtime_dir=runtime,
        flows_dir=runtime / "flows",
        kafka_bootstrap_servers=None,
        spark_conf={"spark.ui.enabled": "false", **TRAINING_JVM},
    )
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CONFLUX_")}
    env = settings_environment(settings, inherited)
    started = _broker(env, "start")
    if started.returncode != 0:
        raise ConfigError(f"the training broker did not start:\n{started.stderr}")
    try:
        produce_training_events(json.loads(started.stdout)["bootstrap_servers"])
        spec = runtime / "flows" / "training.yaml"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(yaml.safe_dump(TRAINING_FLOW))
        _run_training(spec, runtime / "training.log", {**env, DUMP_ENV: str(archive)})
    finally:
        _broker(env, "stop")
    if not archive.exists():
        raise ConfigError(f"the training JVM wrote no archive; see {runtime / 'training.log'}")


def _run_training(spec: Path, log: Path, env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "pipelines.runner", "--spec", str(spec)]
    command += ["--trigger", "available_now"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            code = process.wait(TIMEOUT_SECONDS)
            _wait_for_group(process.pid, TIMEOUT_SECONDS)  # the JVM dumps after Python exits
        finally:
            if process.poll() is None or group_pids(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ConfigError(f"the training run for the class archive failed (exit {code}):\n{tail}")


def _wait_for_group(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_pids(pgid):
        if time.monotonic() >= deadline:
            raise ConfigError(f"the training JVM did not exit within {timeout:.0f} s")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args(argv)
    try:
        check_java()
        jars_dir = load_settings(profile=Profile.LOCAL).jars_dir
        key = archive_key(jars_dir)
        if class_archive(jars_dir) is not None and not args.force:
            print(f"class archive up to date: {jars_dir / ARCHIVE_NAME}")
            return 0
        started = time.monotonic()
        (jars_dir / f"{ARCHIVE_NAME}.key").unlink(missing_ok=True)  # no stale key on a failure
        print(
            "building the JVM class archive (once, ~1-2 min: a training run of Spark, so that "
            "every later Spark start is ~2 s faster)",
            flush=True,
        )
        with (
            tempfile.TemporaryDirectory(prefix=".class-archive-", dir=jars_dir) as scratch,
            ticking(15.0),
        ):
            staged = Path(scratch) / ARCHIVE_NAME  # same filesystem: os.replace is atomic
            train(staged, Path(scratch) / "runtime")
            os.replace(staged, jars_dir / ARCHIVE_NAME)
        (jars_dir / f"{ARCHIVE_NAME}.key").write_text(key)
        size = (jars_dir / ARCHIVE_NAME).stat().st_size / 1e6
        print(f"class archive built in {time.monotonic() - started:.0f} s: "
              f"{jars_dir / ARCHIVE_NAME} ({size:.0f} MB)")  # fmt: skip
    except (ConfigError, OSError, subprocess.SubprocessError) as exc:
        print(f"warning: no JVM class archive ({exc}); Spark starts without it, ~2 s slower. "
              "Retry with `make jvm-archive`.", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

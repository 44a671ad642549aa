"""Facts about the machine and the versions under test, for the report."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def load_average() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def _meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0])  # kB
    return values


def memory() -> str:
    info = _meminfo()
    gib = 1024 * 1024
    return f"{info['MemTotal'] / gib:.1f} GiB total, {info['MemAvailable'] / gib:.1f} GiB available"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"


def java_version() -> str:
    result = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    lines = (result.stderr or result.stdout).splitlines()
    return lines[0] if lines else "unknown"


def machine_facts() -> dict[str, str]:
    uname = os.uname()
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu_model(),
        "memory": memory(),
        "kernel": f"{uname.sysname} {uname.release} {uname.machine}",
        "python": sys.version.split()[0],
        "java": java_version(),
    }


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _jar(folder: Path, prefix: str) -> str:
    jars = sorted(p.name for p in folder.glob(f"{prefix}*.jar"))
    return ", ".join(jars) or f"no {prefix}*.jar in {folder}"


def versions(jars_dir: Path) -> dict[str, str]:
    import confluent_kafka

    from pipelines.jvm import class_archive

    archive = class_archive(jars_dir)
    return {
        "JVM class archive (Conflux drivers only)": (
            f"{archive} ({archive.stat().st_size / 1e6:.0f} MB)" if archive else "none"
        ),
        "deltalake (delta-rs)": _package("deltalake"),
        "pyspark": _package("pyspark"),
        "delta-spark": _package("delta-spark"),
        "Kafka broker jar": _jar(jars_dir / "kafka", "kafka_2.13-"),
        "Spark Kafka connector": _jar(jars_dir / "spark", "spark-sql-kafka")
        + "; "
        + _jar(jars_dir / "spark", "kafka-clients"),
        "confluent-kafka / librdkafka": (
            f"{_package('confluent-kafka')} / {confluent_kafka.libversion()[0]}"
        ),
    }

"""The benchmark harness's check: its throughput and latency runners on the same small topic.

Not in ``make test`` (marker ``bench``, deselected in ``addopts``; ``make bench-quick`` runs it
after its smoke run of every benchmark): it checks the harness, not Conflux, and took ~5 % of the
suite's per-test time in the slow spells that brought CI near its 90-minute limit
(bench/HISTORY.md, "Suite, seventeenth session"). Run ``make bench-quick`` after changing
``bench/``.

Checks results, not speed (full runs are in BENCHMARKS.md): each of the four throughput runners
(Conflux's flow, the default hand-written Spark job, the confluent-kafka + delta-rs writer and
the bare consume loop) holds or read exactly the topic's records, each (partition, offset) once,
the same set for all four; every runner committed (or counted) the same number of records at a
time; each latency runner's table shows every measured event, read back by the delta-rs poller
(one rate here: the harness's loop over rates is the same for one or two).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runtime import KafkaBroker

pytestmark = pytest.mark.bench
PROJECT_ROOT = Path(__file__).resolve().parents[2]
QUICK_RECORDS = 3_000
QUICK_COMMIT = 1_500


def test_quick_bench_runs_every_runner_on_the_same_records(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    results = tmp_path / "quick.json"
    # one rate, 1 s of warm-up and 2 measured (--quick's 2 + 5): what is checked is that every
    # event produced is seen, not how fast; the runners start and stop the same way
    command = [sys.executable, "bench/run.py", "--quick", "--only", "bronze_throughput",
               "e2e_latency", "--latency-rates", "500", "--latency-warmup", "1",
               "--latency-seconds", "2", "--bootstrap", kafka_broker.bootstrap_servers,
               "--json", str(results)]  # fmt: skip
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    document = json.loads(results.read_text())

    runs = document["results"]["bronze_throughput"]["runs"]
    assert sorted(r["runner"] for r in runs) == ["conflux", "consume", "deltars", "spark_default"]
    for run in runs:
        assert run["records"] == QUICK_RECORDS
        assert run["rows_verified"] == run["offsets_verified"] == QUICK_RECORDS, run
        assert run["commits"] == QUICK_RECORDS // QUICK_COMMIT, run
        assert sum(run["commit_sizes"]) == QUICK_RECORDS, run
        # Spark splits maxOffsetsPerTrigger over the partitions, rounding: within 3 records
        assert all(abs(size - QUICK_COMMIT) <= 3 for size in run["commit_sizes"]), run
        assert run["cold_start_seconds"] > 0 and run["peak_rss_mb"] > 0 and run["cpu_seconds"] > 0
    offsets = {json.dumps(r["offsets"]) for r in runs}
    assert len(offsets) == 1, offsets
    partitions = runs[0]["offsets"]
    assert [p[0] for p in partitions] == [0, 1, 2]
    assert all(first == 0 and last == count - 1 for _, first, last, count in partitions)
    assert sum(count for *_, count in partitions) == QUICK_RECORDS

    latency = document["results"]["e2e_latency"]
    assert sorted(r["runner"] for r in latency["runners"]) == ["conflux", "deltars"]
    for runner in latency["runners"]:
        assert [p["rate"] for p in runner["phases"]] == latency["plan"]["rates"]
        for phase in runner["phases"]:
            assert phase["kept_up"], (runner["runner"], phase)
            assert phase["rows_seen"] == phase["produced"] > 0, (runner["runner"], phase)
            assert 0 < phase["latencies_ms"]["p50"] <= phase["latencies_ms"]["max"]

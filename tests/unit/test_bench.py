"""The benchmark harness's own logic (issue 12), without a JVM or a broker: the report that
becomes BENCHMARKS.md, the latency percentiles, the offsets the Python writer checks, and when
a Spark driver maps the JVM class archive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.benchmarks_md import markdown, targets
from bench.latency import percentile
from bench.python_writer import Offsets
from pipelines import jvm


def _spread(value: float) -> dict[str, float]:
    return {"min": value * 0.9, "median": value, "max": value * 1.1}


def _runner(steady: float, wall_rate: float, cold: float) -> dict[str, dict[str, float]]:
    return {
        "records_per_second": _spread(wall_rate),
        "steady_records_per_second": _spread(steady),
        "wall_seconds": _spread(1e6 / wall_rate),
        "cold_start_seconds": _spread(cold),
        "peak_rss_mb": _spread(1000),
        "cpu_seconds_per_million": _spread(30),
    }


def _document() -> dict:
    summary = {
        "1000000": {
            "conflux": _runner(180_000, 50_000, 9.5),
            "deltars": _runner(160_000, 150_000, 2.0),
            "spark_default": _runner(60_000, 40_000, 9.0),
        }
    }
    ratios = {
        "1000000: conflux / deltars steady_records_per_second": 180 / 160,
        "1000000: conflux / deltars records_per_second": 50 / 150,
        "1000000: conflux / spark_default records_per_second": 50 / 40,
    }
    phase = {"rate": 500, "produced": 10, "kept_up": True, "catch_up_seconds": 1.0,
             "latencies_ms": {"p50": 900, "p95": 1500, "p99": 2100, "max": 2300},
             "quantiles_ms": list(range(101)), "rows_seen": 10, "commits": 3}  # fmt: skip
    return {
        "started_at": "2026-11-24T07:00:00+00:00",
        "command": ".venv/bin/python bench/run.py --write-benchmarks",
        "wall_seconds": 2400,
        "machine": {"nproc": "2"},
        "versions": {"pyspark": "4.1.3"},
        "rows": [{"benchmark": "spark_session_start", "metric": "m", "value": "1 s", "notes": ""}],
        "results": {
            "bronze_throughput": {
                "commit_records": 250_000,
                "produce": {"1000000": {"payload_bytes": 500_000_000}},
                "summary": summary,
                "ratios": ratios,
                "runs": [],
            },
            "e2e_latency": {
                "plan": {
                    "rates": [500],
                    "seconds": 30,
                    "warmup": 5,
                    "interval_ms": 500,
                    "table_rows": 1_000_000,
                },
                "poll_seconds": 0.05,
                "runners": [{"runner": "conflux", "phases": [phase]}],
            },
        },
    }


def test_targets_judge_each_figure_of_the_run() -> None:
    verdicts = {target[:12]: (measured, verdict)
                for target, measured, verdict in targets(_document()["results"])}  # fmt: skip
    assert verdicts["bronze stead"] == ("1.12x at 1,000,000 records", "met")
    assert verdicts["wall time (e"][1] == "**not met**"  # 0.33 < 0.8
    assert verdicts[">= 1.2x the "] == ("1.25x at 1,000,000 records", "met")
    assert verdicts["cold start ("] == ("9.5 s (median, 1,000,000 records)", "met")
    assert verdicts["p99 produce "] == ("2,100 ms", "**not met**")


def _latency_run(rate: float, history: bool, p99: float) -> dict[str, object]:
    stats = {"p50": p99 / 2, "p95": p99 * 0.9, "p99": p99, "max": p99 * 1.1}
    run: dict[str, object] = {"pace": {"rate": rate, "seconds": 600, "warmup": 60},
                              "history": history, "chaining": "bronze_batch", "latency_ms": stats}  # fmt: skip
    if history:
        run["history_latency_ms"] = {k: v * 2 for k, v in stats.items()}
    return run


def _merge_result(table: str, keys: int, shape: str, seconds: float) -> dict[str, object]:
    return {"table": table, "keys": keys, "batch": 1000, "events_per_batch": 1000, "shape": shape,
            "changes_per_key": 2, "deletion_vectors": True, "conf": {},
            "runs": [{"seconds": seconds}] * 4, "optimizations": [{"seconds": seconds}]}  # fmt: skip


def test_silver_targets_judge_freshness_merge_and_history() -> None:
    """Issue 25's targets in BENCHMARKS.md: the best design's p99 at each rate, the MERGE's
    events/s at 10M keys per shape with OPTIMIZE's time counted, history against current."""
    results = {
        "silver_latency": {"results": [
            _latency_run(500, False, 4_900), _latency_run(5_000, False, 40_000),
            _latency_run(500, True, 6_000),
        ]},
        "merge_throughput": {"results": [
            _merge_result("current", 10_000_000, "uniform", 1000 / 35_000),  # 35k/s a batch
            _merge_result("current", 10_000_000, "recent", 1000 / 70_000),
            _merge_result("current", 1_000_000, "uniform", 0.1),
            _merge_result("history", 1_000_000, "uniform", 0.25),  # 0.4x
        ]},
    }  # fmt: skip
    verdicts = {target: (measured, verdict) for target, measured, verdict in targets(results)}
    assert verdicts["silver: p99 produce → current table <= 5 s at 500 changes/s"] == (
        "4,900 ms (bronze_batch)", "met")  # fmt: skip
    assert verdicts["silver: p99 produce → current table <= 15 s at 5,000 changes/s"][1] == (
        "**not met**")  # fmt: skip
    assert verdicts["silver: p99 produce → history table <= 8 s at 500 changes/s"] == (
        "12,000 ms (bronze_batch)", "**not met**")  # fmt: skip
    merge = {t.split(" into")[0]: (m, v) for t, (m, v) in verdicts.items() if t.startswith("MERGE")}
    assert merge == {
        "MERGE >= 30,000 change events/s": ("28,000/s", "**not met**"),  # OPTIMIZE counted
        "MERGE >= 50,000 change events/s": ("56,000/s", "met"),
    }
    history = next(v for t, v in verdicts.items() if t.startswith("history >= 0.35x"))
    assert history == ("0.40x", "met")


def test_the_hand_written_floor_is_a_ratio_never_a_verdict() -> None:
    """The hand-written MERGE job runs beside Conflux as a floor: its latency is reported as the
    ratio Conflux / floor, and a target is judged on Conflux's runs only, even when the floor's
    p99 is lower."""
    from bench.silver_latency import HAND_WRITTEN, HAND_WRITTEN_EXACTLY_ONCE, _ratios

    conflux = {**_latency_run(500, False, 8_000), "interval": "500 milliseconds"}
    floor = {**conflux, "chaining": HAND_WRITTEN,
             "latency_ms": {"p50": 2_000.0, "p95": 4_000.0, "p99": 5_000.0, "max": 6_000.0}}  # fmt: skip
    verdicts = {t: (m, v) for t, m, v in targets({"silver_latency": {"results": [conflux, floor]}})}
    assert verdicts["silver: p99 produce → current table <= 5 s at 500 changes/s"] == (
        "8,000 ms (bronze_batch)", "**not met**")  # fmt: skip
    (ratio,) = _ratios([conflux, floor])
    assert ratio.metric == "ratio bronze_batch / hand_written, 500/s, trigger 500 milliseconds"
    assert ratio.value == "2.00 / 1.80 / 1.60"
    same_writes = {**floor, "chaining": HAND_WRITTEN_EXACTLY_ONCE,
                   "latency_ms": {"p50": 4_000.0, "p95": 6_000.0, "p99": 6_400.0}}  # fmt: skip
    results = [conflux, floor, same_writes]
    verdicts = {t: (m, v) for t, m, v in targets({"silver_latency": {"results": results}})}
    assert verdicts["silver: p99 produce → current table <= 5 s at 500 changes/s"] == (
        "8,000 ms (bronze_batch)", "**not met**")  # fmt: skip
    assert [r.metric.split(",")[0] for r in _ratios(results)] == [
        "ratio bronze_batch / hand_written",
        "ratio bronze_batch / hand_written_exactly_once",
    ]


def test_markdown_states_command_figures_and_plots() -> None:
    text = markdown(_document())
    assert "do not edit by hand" in text
    assert "Command: `.venv/bin/python bench/run.py --write-benchmarks` (wall time 40 min)" in text
    assert "| records/s, steady state | 180,000 (162,000 - 198,000) |" in text
    assert "![latency distribution](bench/results/latency.png)" in text
    assert "![throughput per runner](bench/results/throughput.png)" in text
    assert "| conflux | 500 | 900 | 1,500 | 2,100 | 2,300 | 10 | 3 | yes |" in text
    assert "| spark_session_start | m | 1 s |  |" in text


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_offsets_count_gaps_and_repeats() -> None:
    offsets = Offsets()
    for partition, offset in [(0, 0), (0, 1), (1, 5), (0, 3), (0, 3), (1, 6)]:
        offsets.see(partition, offset)
    summary = offsets.summary()
    assert summary["partitions"] == {"0": {"first": 0, "last": 3, "count": 4},
                                     "1": {"first": 5, "last": 6, "count": 2}}  # fmt: skip
    assert summary["sequence_breaks"] == 2  # 1 -> 3 skips one, 3 -> 3 repeats


@pytest.fixture
def jars_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(jvm, "java_version_text", lambda binary: 'openjdk version "17.0.9"')
    monkeypatch.delenv(jvm.DUMP_ENV, raising=False)
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "MANIFEST.txt").write_text("delta-spark 4.4.0\n")
    return tmp_path


def test_class_archive_is_used_only_when_built_for_this_jdk_and_these_jars(jars_dir: Path) -> None:
    assert jvm.class_archive_options(jars_dir) == ""  # none built yet
    (jars_dir / jvm.ARCHIVE_NAME).write_bytes(b"archive")
    (jars_dir / f"{jvm.ARCHIVE_NAME}.key").write_text("another JDK")
    assert jvm.class_archive_options(jars_dir) == ""
    (jars_dir / f"{jvm.ARCHIVE_NAME}.key").write_text(jvm.archive_key(jars_dir))
    archive = jars_dir / jvm.ARCHIVE_NAME
    assert jvm.class_archive_options(jars_dir) == f"-XX:SharedArchiveFile={archive} -Xshare:auto"


def test_the_archive_builder_makes_the_driver_dump_its_classes(
    jars_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm.DUMP_ENV, "/tmp/x.jsa")
    assert jvm.class_archive_options(jars_dir) == "-XX:ArchiveClassesAtExit=/tmp/x.jsa"


def test_plots_and_the_file_are_written(tmp_path: Path) -> None:
    from bench.benchmarks_md import write

    document = _document()
    summary = document["results"]["bronze_throughput"]["summary"]
    summary["10000000"] = dict(summary["1000000"])
    document["results"]["bronze_throughput"]["produce"]["10000000"] = {"payload_bytes": 5e9}
    write(document, tmp_path / "BENCHMARKS.md", tmp_path / "results")
    for name in ("throughput.png", "latency.png", "results.json"):
        assert (tmp_path / "results" / name).stat().st_size > 1000, name
    assert "### 10,000,000 records" in (tmp_path / "BENCHMARKS.md").read_text()


def test_quick_mode_keeps_what_the_command_line_says() -> None:
    from bench.run import parse_args

    quick = parse_args(["--quick"])
    assert (quick.records, quick.repeats, quick.commit_records) == ([3_000], 1, 1_500)
    assert parse_args(["--quick", "--repeats", "2"]).repeats == 2
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--write-benchmarks"])


def test_task_times_sums_every_successful_tasks_metrics_from_the_event_log(
    tmp_path: Path,
) -> None:
    """The cluster benchmark's breakdown: run, deserialize and result times as logged, the
    scheduler delay as the Spark UI computes it (the rest of launch → finish, never below 0),
    CPU in ns; failed and lost tasks counted apart, not summed; when the last executor
    registered after the application started. The keys are Spark 4.1's event-log names."""
    from bench.cluster import task_times

    def task(
        launch: int, finish: int, run: int, *, getting: int = 0, reason: str = "Success"
    ) -> dict[str, object]:
        return {
            "Event": "SparkListenerTaskEnd",
            "Task End Reason": {"Reason": reason},
            "Task Info": {
                "Launch Time": launch, "Finish Time": finish, "Getting Result Time": getting
            },
            "Task Metrics": {
                "Executor Run Time": run,
                "Executor Deserialize Time": 100,
                "Result Serialization Time": 10,
                "JVM GC Time": 5,
                "Executor CPU Time": 200_000_000,
                "Executor Deserialize CPU Time": 50_000_000,
                "Shuffle Read Metrics": {
                    "Remote Bytes Read": 2_000_000, "Local Bytes Read": 500_000,
                    "Fetch Wait Time": 7,
                },
                "Shuffle Write Metrics": {
                    "Shuffle Bytes Written": 1_000_000, "Shuffle Write Time": 30_000_000
                },
            },
        }  # fmt: skip

    events = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000_000},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 1_002_000},
        {"Event": "SparkListenerExecutorAdded", "Timestamp": 1_009_500},
        task(1_010_000, 1_011_000, 800, getting=1_010_950),  # 50 ms sending its result
        task(1_012_000, 1_012_300, 250),  # run + deserialize + serialize > duration: delay 0
        task(1_013_000, 1_013_900, 700, reason="ExceptionFailure"),  # metrics, but failed
        {"Event": "SparkListenerTaskEnd", "Task End Reason": {"Reason": "ExecutorLostFailure"},
         "Task Info": {}},  # lost with its executor: no metrics at all
    ]  # fmt: skip
    (tmp_path / "app-1").write_text("\n".join(json.dumps(e) for e in events) + "\n")

    times = task_times(tmp_path)

    assert (times["tasks"], times["failed_tasks"]) == (2, 2)
    assert times["task_seconds"] == pytest.approx(1.3)
    assert times["run_seconds"] == pytest.approx(1.05)
    assert times["deserialize_seconds"] == pytest.approx(0.2)
    assert times["result_serialize_seconds"] == pytest.approx(0.02)
    assert times["getting_result_seconds"] == pytest.approx(0.05)
    assert times["scheduler_delay_seconds"] == pytest.approx(0.04)  # 1000 - 800 - 100 - 10 - 50
    assert times["cpu_seconds"] == pytest.approx(0.5)
    assert times["gc_seconds"] == pytest.approx(0.01)
    assert times["shuffle_remote_mb"] == pytest.approx(4.0)
    assert times["shuffle_local_mb"] == pytest.approx(1.0)
    assert times["shuffle_fetch_wait_seconds"] == pytest.approx(0.014)
    assert times["shuffle_written_mb"] == pytest.approx(2.0)
    assert times["shuffle_write_seconds"] == pytest.approx(0.06)
    assert (times["executors"], times["executors_ready_seconds"]) == (2, 9.5)


def test_task_times_refuses_a_folder_without_exactly_one_event_log(tmp_path: Path) -> None:
    from bench.cluster import task_times
    from bench.harness import BenchError

    with pytest.raises(BenchError, match="expected one finished Spark event log, found \\[\\]"):
        task_times(tmp_path)
    (tmp_path / "app-1.inprogress").write_text("")  # the driver never stopped cleanly
    with pytest.raises(BenchError, match=r"app-1\.inprogress"):
        task_times(tmp_path)

"""Table maintenance without a JVM: the VACUUM retention of the slowest reader, read from a stream's
checkpoint and the Delta log on disk; retries of commit conflicts; a failing table reported
without stopping the others; the Dagster job, its observations and the spec's schedule."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from dagster import AssetKey, ConfigurableResource, DagsterEventType, DagsterInstance

import assets.maintenance as dagster_maintenance
from assets.builder import build_definitions
from assets.flows import flow_pool
from assets.maintenance import maintenance_pool
from pipelines import maintenance
from pipelines.catalog.state import FlowState
from pipelines.cli import main
from pipelines.location import Location
from pipelines.maintenance import (
    MaintenanceCommandError,
    TableReport,
    is_commit_conflict,
    maintain_flow,
    retrying,
)
from pipelines.retention import (
    STREAM_MARGIN,
    StreamNeed,
    UndatedVersionError,
    commit_time,
    flow_tables,
    parse_duration,
    stream_needs,
    stream_readers,
    stream_start_version,
    vacuum_retention,
)
from pipelines.settings import Settings, load_settings
from pipelines.spec import FlowSpec, parse_spec

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def people(**silver: Any) -> dict[str, Any]:
    return {
        "name": "people",
        "source": {"kind": "kafka", "topics": ["people_cdc"]},
        "target": {"table": "bronze_people"},
        "silver": {
            "format": "debezium",
            "schema": "id BIGINT, name STRING, city STRING",
            "current": {"table": "people", "keys": ["id"], "z_order_by": ["city"]},
            **silver,
        },
    }


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(load_settings(environ={}), runtime_dir=tmp_path / "runtime")


# --- durations -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hours"),
    [
        ("7 days", 168),
        ("12 hours", 12),
        ("1 day", 24),
        ("interval 30 days", 720),
        ("interval 2 weeks", 336),
        ("INTERVAL 1 week 2 days", 216),
        ("90 minutes", 1.5),
    ],
)
def test_durations_of_the_spec_and_of_delta_properties(text: str, hours: float) -> None:
    assert parse_duration(text) == timedelta(hours=hours)


@pytest.mark.parametrize("text", ["", "forever", "7 fortnights", "interval", "7 days please"])
def test_what_is_not_a_duration(text: str) -> None:
    assert parse_duration(text) is None


# --- a stream's position, from its checkpoint ------------------------------------------------------


def offsets_file(version: int | None) -> str:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    source = (
        {"sourceVersion": 1, "reservoirId": "x", "reservoirVersion": version, "index": -1}
        if version is not None
        else {"orders": {"0": 5}}  # a Kafka source: no Delta position
    )
    return "\n".join(["v1", json.dumps(meta), json.dumps(source)])


def checkpoint(root: Location, offsets: dict[int, int | None], commits: list[int]) -> Location:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for batch, version in offsets.items():
        (root / "offsets" / str(batch)).write_text(offsets_file(version))
        (root / "offsets" / f".{batch}.crc").write_text("")  # Hadoop's checksum files
    for batch in commits:
        (root / "commits" / str(batch)).write_text("v1\n{}")
    return root


def test_a_stream_restarts_where_its_last_committed_batch_ended(tmp_path: Path) -> None:
    # batch 2 is planned (offsets/2) but not committed: it re-reads from offsets/1's end
    root = checkpoint(Location.local(tmp_path / "cp"), {0: 3, 1: 7, 2: 12}, [0, 1])
    assert stream_start_version(root) == 7


def test_before_its_first_commit_a_stream_needs_its_first_batch(tmp_path: Path) -> None:
    root = checkpoint(Location.local(tmp_path / "cp"), {0: 4}, [])
    assert stream_start_version(root) == 4


def test_no_offsets_no_delta_source_no_position(tmp_path: Path) -> None:
    assert stream_start_version(Location.local(tmp_path / "missing")) is None
    kafka = checkpoint(Location.local(tmp_path / "kafka"), {0: None}, [0])
    assert stream_start_version(kafka) is None


# --- when a version was committed, from the Delta log ----------------------------------------------


def commit(table: Location, version: int, info: dict[str, Any] | None) -> Location:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    path = log / f"{version:020d}.json"
    actions = [{"add": {"path": f"part-{version}.parquet", "dataChange": True}}]
    if info is not None:
        actions.insert(0, {"commitInfo": info})
    path.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    return path


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_commit_time_from_commit_info(tmp_path: Path) -> None:
    table = Location.local(tmp_path / "t")
    commit(table, 0, {"timestamp": millis(NOW - timedelta(days=3))})
    commit(
        table,
        1,
        {
            "timestamp": millis(NOW),
            "inCommitTimestamp": millis(NOW - timedelta(days=1)),  # wins where enabled
        },
    )
    assert commit_time(table, 0) == NOW - timedelta(days=3)
    assert commit_time(table, 1) == NOW - timedelta(days=1)


def test_commit_time_falls_back_to_the_files_mtime(tmp_path: Path) -> None:
    table = Location.local(tmp_path / "t")
    path = commit(table, 0, None)
    moment = (NOW - timedelta(days=2)).timestamp()
    os.utime(path.path, (moment, moment))
    assert commit_time(table, 0) == NOW - timedelta(days=2)


def test_a_version_not_committed_yet_is_needed_by_nobody(tmp_path: Path) -> None:
    table = Location.local(tmp_path / "t")
    commit(table, 0, {"timestamp": millis(NOW)})
    assert commit_time(table, 1) is None  # a caught-up stream points at the next one


def test_a_needed_version_whose_log_entry_is_gone_cannot_be_dated(tmp_path: Path) -> None:
    table = Location.local(tmp_path / "t")
    commit(table, 5, {"timestamp": millis(NOW)})
    with pytest.raises(UndatedVersionError, match=r"00000000000000000002\.json is gone"):
        commit_time(table, 2)


# --- the retention -----------------------------------------------------------------------------------


def test_the_declared_retention_when_no_stream_is_behind() -> None:
    retention = vacuum_retention("7 days", None, [], NOW)
    assert (retention.hours, retention.reason) == (168, "maintenance.vacuum_retention 7 days")
    at_head = [StreamNeed("people.silver", 12, None)]
    assert vacuum_retention("8 days", None, at_head, NOW).hours == 192


def test_a_longer_table_default_wins() -> None:
    retention = vacuum_retention("7 days", "interval 30 days", [], NOW)
    assert retention.hours == 720
    assert "deletedFileRetentionDuration interval 30 days" in retention.reason
    assert vacuum_retention("14 days", "interval 7 days", [], NOW).hours == 336


def test_a_stream_behind_raises_the_retention_to_its_oldest_version() -> None:
    behind = StreamNeed("people.silver", 3, NOW - timedelta(days=9, minutes=30))
    retention = vacuum_retention("7 days", None, [behind], NOW)
    assert retention.hours == 9 * 24 + 1 + 1  # 9 days 30 min, + 1 h margin, rounded up
    assert timedelta(hours=retention.hours) >= NOW - behind.committed_at + STREAM_MARGIN
    assert retention.reason == (
        "stream people.silver still reads version 3, committed 9.0 days ago (+1.0 hours margin)"
    )
    recent = StreamNeed("people.silver", 3, NOW - timedelta(days=2))
    assert vacuum_retention("7 days", None, [recent], NOW).hours == 168


def test_the_silver_stream_is_the_reader_of_bronze(tmp_path: Path, settings: Settings) -> None:
    spec = parse_spec(people())
    [reader] = stream_readers(spec, settings)
    assert reader.reads == "bronze" and reader.query == "people.silver"
    assert reader.checkpoint == FlowState.of(spec, settings).stage_checkpoint("silver")
    assert stream_readers(parse_spec(people(chaining="bronze_batch")), settings) == []
    bronze_only = people()
    del bronze_only["silver"]
    assert stream_readers(parse_spec(bronze_only), settings) == []

    tables = {t.role: t for t in flow_tables(spec, settings)}
    checkpoint(reader.checkpoint, {0: 2, 1: 5}, [0])
    commit(tables["bronze"].path, 2, {"timestamp": millis(NOW - timedelta(days=10))})
    [need] = stream_needs([reader], tables["bronze"])
    assert (need.version, need.committed_at) == (2, NOW - timedelta(days=10))
    assert stream_needs([reader], tables["events"]) == []  # nobody streams from events


def test_every_table_of_the_flow_with_its_z_order(settings: Settings) -> None:
    spec = parse_spec(people(events={"table": "people_events", "z_order_by": ["name"]}))
    tables = flow_tables(spec, settings)
    assert [(t.id, t.name, t.z_order_by) for t in tables] == [
        ("bronze", "bronze_people", ()),
        ("events", "people_events", ("name",)),
        ("quarantine", "silver_people_quarantine", ()),
        ("current", "people", ("city",)),
        ("deleted_keys", "people__deleted_keys", ()),
    ]
    assert tables[-1].path == Location.local(f"{tables[-2].path}__deleted_keys")
    assert tables[0].spec_field == "target" and tables[3].spec_field == "silver.current"


# --- retries -------------------------------------------------------------------------------------


class ConcurrentAppendException(Exception):  # noqa: N818 (Delta's name)
    """Named like Delta's (delta.exceptions converts the JVM's to a class of this name)."""


def test_commit_conflicts_are_recognised_by_class_message_or_cause() -> None:
    assert is_commit_conflict(ConcurrentAppendException("Files were added"))
    assert is_commit_conflict(
        RuntimeError("[DELTA_CONCURRENT_DELETE_READ] Transaction conflict detected.")
    )
    assert is_commit_conflict(
        RuntimeError("io.delta.exceptions.ConcurrentDeleteDeleteException: This transaction")
    )
    try:
        try:
            raise ConcurrentAppendException("lost the race")
        except ConcurrentAppendException as inner:
            raise RuntimeError("OPTIMIZE failed") from inner
    except RuntimeError as outer:
        assert is_commit_conflict(outer)
    assert not is_commit_conflict(ValueError("[DELTA_ZORDERING_COLUMN_DOES_NOT_EXIST] nope"))


def test_a_conflict_is_retried_with_backoff_then_reported() -> None:
    slept: list[float] = []
    calls = []

    def always_conflicts() -> None:
        calls.append(1)
        raise ConcurrentAppendException("a concurrent MERGE added data")

    with pytest.raises(MaintenanceCommandError) as raised:
        retrying("OPTIMIZE", always_conflicts, attempts=4, backoff=2.0, sleep=slept.append)
    assert len(calls) == 4 and slept == [2.0, 4.0, 8.0]
    assert raised.value.attempts == 4
    assert str(raised.value).startswith("OPTIMIZE failed after 4 attempt(s): a concurrent MERGE")
    assert "the next maintenance run tries again" in str(raised.value)


def test_a_conflict_then_success_and_other_errors_at_once() -> None:
    outcomes: list[Exception | str] = [ConcurrentAppendException("race"), "done"]

    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retrying("VACUUM", flaky, sleep=lambda _s: None) == ("done", 2)

    def broken() -> None:
        raise ValueError("column nope does not exist")

    with pytest.raises(MaintenanceCommandError) as raised:
        retrying("OPTIMIZE", broken, sleep=lambda _s: pytest.fail("no retry"))
    assert raised.value.attempts == 1


# --- a flow's tables, on a fake Spark ------------------------------------------------------------


class FakeFrame:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def first(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def collect(self) -> list[dict[str, Any]]:
        return self.rows


class FakeConf(dict[str, str]):
    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key, default)

    def set(self, key: str, value: str) -> None:
        self[key] = value


class FakeSpark:
    """Answers the statements maintenance sends; OPTIMIZE of ``conflicts`` tables always races."""

    def __init__(self, conflicts: set[str]) -> None:
        self.conflicts = conflicts
        self.files: dict[str, int] = {}
        self.statements: list[str] = []
        self.conf = FakeConf()
        self.sparkContext = SimpleNamespace(defaultParallelism=4)

    def newSession(self) -> FakeSpark:  # noqa: N802 (PySpark's name)
        self.conf = FakeConf()  # VACUUM's own session: its conf is checked below
        return self

    def sql(self, statement: str) -> FakeFrame:
        self.statements.append(statement)
        path = statement.split("`")[1]
        files = self.files.setdefault(path, 10)
        if statement.startswith("DESCRIBE DETAIL"):
            return FakeFrame([{"numFiles": files, "sizeInBytes": files * 1000, "properties": {}}])
        if statement.startswith("OPTIMIZE"):
            if Path(path).name in self.conflicts:
                raise ConcurrentAppendException(f"a concurrent MERGE committed to {path}")
            self.files[path] = 1
            metrics = {"numFilesRemoved": files, "numFilesAdded": 1}
            return FakeFrame([{"path": path, "metrics": metrics}])
        if statement.startswith("VACUUM"):
            assert self.conf[maintenance.LISTING_PARALLELISM] == "4"  # not Spark's 10,000 tasks
            return FakeFrame([{"path": path}])
        if statement.startswith("DESCRIBE HISTORY"):
            metrics = {"numDeletedFiles": "9"}
            return FakeFrame(
                [{"operation": "VACUUM END", "version": 1, "operationMetrics": metrics}]
            )
        raise AssertionError(statement)


def existing_tables(spec: FlowSpec, settings: Settings, *roles: str) -> None:
    for table in flow_tables(spec, settings):
        if table.id in roles:
            commit(table.path, 0, {"timestamp": millis(datetime.now(UTC))})


def test_a_failing_table_is_reported_and_the_others_maintained(settings: Settings) -> None:
    spec = parse_spec(people())
    existing_tables(spec, settings, "bronze", "events", "current")  # quarantine: never written
    spark = FakeSpark(conflicts={"silver_people_events"})

    reports = maintain_flow(spark, spec, settings, sleep=lambda _s: None)  # type: ignore[arg-type]

    by_role = {r.role: r for r in reports}
    assert list(by_role) == ["bronze", "events", "current"]
    bronze, events, current = by_role["bronze"], by_role["events"], by_role["current"]
    assert (bronze.status, bronze.files_before, bronze.files_after) == ("ok", 10, 1)
    assert (bronze.files_removed, bronze.files_added, bronze.files_vacuumed) == (10, 1, 9)
    assert bronze.retention_hours == 168 and bronze.attempts == 2  # OPTIMIZE, VACUUM
    assert current.status == "ok"
    assert "ZORDER BY (`city`)" in " ".join(s for s in spark.statements if "people`" in s)
    assert events.status == "failed" and events.attempts == 4 + 1
    assert events.vacuumed and events.files_after == 10  # VACUUM ran after OPTIMIZE failed
    [error] = events.errors
    assert error.startswith(
        "<inline>: silver.events: the events table silver_people_events at "
        f"{settings.lake / 'silver' / 'silver_people_events'}: OPTIMIZE failed after 4 "
        "attempt(s): a concurrent MERGE committed"
    )
    assert "failed" in events.summary() and "error:" in events.summary()


def test_flags_override_the_spec(settings: Settings) -> None:
    spec = parse_spec({**people(), "maintenance": {"vacuum": False}})
    existing_tables(spec, settings, "bronze")
    spark = FakeSpark(conflicts=set())
    [report] = maintain_flow(spark, spec, settings)  # type: ignore[arg-type]
    assert report.optimized and not report.vacuumed
    spark = FakeSpark(conflicts=set())
    [report] = maintain_flow(spark, spec, settings, optimize=False, vacuum=True)  # type: ignore[arg-type]
    assert not report.optimized and report.vacuumed
    assert not any(s.startswith("OPTIMIZE") for s in spark.statements)


def test_a_stream_position_that_cannot_be_dated_skips_vacuum(settings: Settings) -> None:
    spec = parse_spec(people())
    existing_tables(spec, settings, "bronze")
    [reader] = stream_readers(spec, settings)
    checkpoint(reader.checkpoint, {0: 0, 1: 3}, [0, 1])
    bronze = flow_tables(spec, settings)[0].path
    commit(bronze, 5, {"timestamp": millis(NOW)})  # versions 1 to 4 are gone from the log

    [report] = maintain_flow(FakeSpark(set()), spec, settings)  # type: ignore[arg-type]

    assert report.ok and report.optimized and not report.vacuumed
    assert report.notes[0].startswith("VACUUM skipped: a stream's position is unknown")


# --- Dagster -------------------------------------------------------------------------------------


def write_specs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    scheduled = {
        **people(),
        "maintenance": {"schedule": "30 2 * * 0", "vacuum_retention": "9 days"},
    }
    (folder / "people.yaml").write_text(yaml.safe_dump(scheduled))
    orders = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
    }
    (folder / "orders.yaml").write_text(yaml.safe_dump(orders))
    return folder


def test_a_job_per_flow_and_a_schedule_where_the_spec_declares_one(tmp_path: Path) -> None:
    defs = build_definitions(write_specs(tmp_path / "flows"))
    for flow in ("people", "orders"):
        job = defs.resolve_job_def(f"maintain_{flow}")
        [node] = job.graph.node_defs
        assert node.pool == maintenance_pool(parse_spec(people())).replace("people", flow)
        assert node.pool != flow_pool(parse_spec(people()))  # runs beside the flow
    schedules = {s.name: s for s in defs.schedules or []}
    assert set(schedules) == {"maintain_people_schedule"}  # no cron but the spec's
    schedule = schedules["maintain_people_schedule"]
    assert schedule.cron_schedule == "30 2 * * 0"
    assert schedule.execution_timezone == "UTC"
    assert schedule.job_name == "maintain_people"


class FakePySpark(ConfigurableResource):
    @property
    def spark_session(self) -> Any:
        return None


def test_the_job_observes_each_table_and_fails_on_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defs = build_definitions(write_specs(tmp_path / "flows"))
    seen: dict[str, Any] = {}

    def fake_maintain(spark: Any, spec: FlowSpec, settings: Settings, **flags: Any) -> list:
        seen.update(flow=spec.name, **flags)
        ok = TableReport("bronze", "bronze_people", "/lake/b", files_before=40, files_after=2)
        side = TableReport("deleted_keys", "people__deleted_keys", "/lake/p__d", files_before=3)
        bad = TableReport("events", "silver_people_events", "/lake/e", status="failed")
        bad.errors.append("people.yaml: silver.events: OPTIMIZE failed after 4 attempt(s)")
        return [ok, side, bad]

    monkeypatch.setattr(dagster_maintenance, "maintain_flow", fake_maintain)
    job = defs.resolve_job_def("maintain_people")
    instance = DagsterInstance.ephemeral()
    result = job.execute_in_process(
        resources={"pyspark": FakePySpark()},
        run_config={"ops": {"maintain_people_tables": {"config": {"vacuum": False}}}},
        raise_on_error=False,
        instance=instance,
    )

    assert not result.success
    assert seen == {"flow": "people", "optimize": None, "vacuum": False}
    observations = [  # what the UI shows: the instance's event log (the failed step's too)
        record.dagster_event.event_specific_data.asset_observation  # type: ignore[union-attr]
        for record in instance.all_logs(result.run_id, of_type=DagsterEventType.ASSET_OBSERVATION)
    ]
    by_table = {o.metadata["table"].value: o for o in observations}
    assert set(by_table) == {"bronze_people", "people__deleted_keys", "silver_people_events"}
    bronze = by_table["bronze_people"]
    assert bronze.asset_key == AssetKey(["bronze", "bronze_people"])
    assert (bronze.metadata["files_before"].value, bronze.metadata["files_after"].value) == (40, 2)
    assert by_table["people__deleted_keys"].asset_key == AssetKey(["silver", "people"])
    assert "OPTIMIZE failed" in by_table["silver_people_events"].metadata["errors"].value
    [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert "1 of 3 table(s) failed: silver_people_events" in str(failure.event_specific_data)


# --- CLI -----------------------------------------------------------------------------------------


def test_the_cli_names_an_unknown_flow_before_starting_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("CONFLUX_FLOWS_DIR", str(write_specs(tmp_path / "flows")))
    monkeypatch.setattr(
        "pipelines.spark.get_spark_session", lambda *a, **k: pytest.fail("no Spark needed")
    )
    assert main(["maintain", "nobody"]) == 2
    assert "no flow named 'nobody'" in capsys.readouterr().err


def test_the_cli_prints_each_table_and_fails_on_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("CONFLUX_FLOWS_DIR", str(write_specs(tmp_path / "flows")))
    monkeypatch.setattr("pipelines.spark.get_spark_session", lambda *a, **k: FakeStoppable())
    flags: dict[str, Any] = {}

    def fake_maintain(spark: Any, spec: FlowSpec, settings: Settings, **given: Any) -> list:
        flags.update(given)
        bad = TableReport("bronze", "bronze_orders", "/lake/b", status="failed")
        bad.errors.append("orders.yaml: target: VACUUM failed after 1 attempt(s): disk gone")
        return [bad]

    monkeypatch.setattr(maintenance, "maintain_flow", fake_maintain)
    assert main(["maintain", "orders", "--no-optimize"]) == 1
    assert flags == {"optimize": False, "vacuum": None}
    captured = capsys.readouterr()
    assert "bronze table bronze_orders: failed" in captured.out
    assert "disk gone" in captured.out
    assert "maintenance of flow orders failed for bronze_orders" in captured.err


class FakeStoppable:
    def stop(self) -> None:
        pass

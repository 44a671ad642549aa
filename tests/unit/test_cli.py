"""The `conflux` console script's commands that need no Spark: validate, flows, status, stop."""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.cli import main
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.settings import load_settings
from pipelines.spec import load_spec


def write(folder: Path, name: str, **target: str) -> Path:
    path = folder / f"{name}.yaml"
    spec = {
        "name": name,
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": f"bronze_{name}", **target},
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def test_validate_lists_the_flows(flows: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(flows, "a")
    write(flows, "b")
    assert main(["validate"]) == 0
    assert "2 flow(s) valid" in capsys.readouterr().out


def test_two_specs_on_one_table_are_refused(
    flows: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(flows, "a", path=str(tmp_path / "lake" / "t"))
    write(flows, "b", path=str(tmp_path / "lake" / "t"))
    assert main(["validate"]) == 2
    error = capsys.readouterr().err
    assert "b.yaml: target: flow b writes" in error and "flow a" in error


def test_flows_status_and_stop_follow_the_lease(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = load_spec(write(flows, "a"))
    assert main(["flows"]) == 0
    assert "never run" in capsys.readouterr().out
    locations = FlowState.of(spec, load_settings())
    FlowLease("a", FileLeaseStore(locations.lease_dir.path), "cli-123", {"pid": "1"}).acquire()
    assert main(["flows"]) == 0  # its process (pid 1) runs, no heartbeat yet: starting
    assert "running: starting" in capsys.readouterr().out
    assert main(["status", "a"]) == 0
    out = capsys.readouterr().out
    assert "state       running (cli-123): starting" in out and "owner cli-123" in out
    assert main(["stop", "a", "--no-wait"]) == 0
    asked = json.loads(locations.stop_file("cli-123").read_text())["by"]
    assert asked.startswith("conflux stop (user ") and f"pid {os.getpid()})" in asked
    assert main(["status", "nope"]) == 2
    assert "no flow named 'nope'" in capsys.readouterr().err


def test_a_stopped_flow_says_why_it_stopped(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from pipelines.messages import FlowStopped, StopReason
    from pipelines.reporting import Reporter

    spec = load_spec(write(flows, "a"))
    locations = FlowState.of(spec, load_settings())
    lease = FlowLease("a", FileLeaseStore(locations.lease_dir.path), "cli-123", {"pid": "1"})
    lease.acquire()
    reporter = Reporter()
    reporter.track_status({"a": locations.status_file}, owner="cli-123")
    message = "flow a failed: expectation positive (amount > 0) failed on 1 row(s)\nmore"
    reporter.stopped(FlowStopped("a", StopReason.EXPECTATION_FAILED, message, "a.silver"))
    assert main(["flows"]) == 0  # its end is recorded: the lease, still held, is not the story
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("a "))
    assert "failed: an expectation failed" in row and row.split()[-1] == "unknown"  # lag
    lease.release()
    assert main(["status", "a"]) == 0
    out = capsys.readouterr().out
    assert f"failed at {datetime.now(UTC).date().isoformat()}" in out
    assert f"an expectation failed: {message.splitlines()[0]}" in out and "\nmore" not in out
    assert "owner cli-123 (pid 1) since" in out and ", released" in out
    assert main(["status", "a", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "failed: an expectation failed"
    assert report["run"]["phase"] == "failed" and report["run"]["reason"] == "expectation_failed"
    assert report["run"]["lag"] is None  # unknown, not 0
    assert report["stopped"]["reason"] == "expectation_failed"
    assert report["stopped"]["query"] == "a.silver"

    # The next owner's run is killed before it records an end: the old end is not its story.
    killed = FlowLease("a", FileLeaseStore(locations.lease_dir.path), "cli-456", {"pid": "2"})
    killed.acquire()
    killed.release()
    assert main(["status", "a"]) == 0
    out = capsys.readouterr().out
    assert "state       failed: crash: its application ended without recording why" in out
    assert "owner cli-456" in out and "expectation" not in out


def test_status_reads_a_status_file_written_by_the_previous_version(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from tests.unit.test_messages import BRONZE_STATUS, PRE_SILVER_STATUS

    spec = load_spec(write(flows, "orders"))
    status_file = FlowState.of(spec, load_settings()).status_file
    status_file.parent.mkdir(parents=True, exist_ok=True)
    status_file.write_text(json.dumps(PRE_SILVER_STATUS))
    assert main(["status", "orders"]) == 0
    out = capsys.readouterr().out
    assert (
        "last batch  2 of orders bronze at 2024-11-20T17:02:44.001Z: 0 rows added (a replay: "
        "Delta skipped its "
        "writes), 50 rows read in 4.0 s (12 rows/s)"
    ) in out
    assert "lag         unknown: not running (0 when batch 2 committed)" in out
    status_file.write_text(json.dumps(BRONZE_STATUS))
    assert main(["status", "orders", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_batch"] == BRONZE_STATUS["last_batch"]
    assert main(["flows"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("orders"))
    assert row.split()[-2:] == ["4", "unknown"]  # last batch, lag (10 then; not running now)
    status_file.write_text('{"last_batch": {"flow": "orders"}}')
    assert main(["status", "orders"]) == 2
    error = capsys.readouterr().err
    assert str(status_file) in error and "'batch_id' is missing" in error and "delete it" in error


def test_catalog_lists_every_table_and_the_flows_state(
    flows: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`conflux catalog` prints what the catalog derives: the tables (side tables included, with
    no asset), the checkpoints of the queries, the state files; ``--json`` the same as data."""
    import json

    spec_file = flows / "shop.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "source": {"kind": "kafka", "topics": ["orders"]},
                "target": {"table": "bronze_shop"},
                "silver": {
                    "format": "json",
                    "schema": "id BIGINT, amount DOUBLE",
                    "current": {"table": "shop_current", "keys": ["id"]},
                    "chaining": "bronze_batch",
                },
            }
        )
    )
    assert main(["catalog", "shop"]) == 0
    out = capsys.readouterr().out
    assert "shop_current__deleted_keys" in out and "(side table)" in out
    assert "silver/shop_current" in out
    assert main(["catalog", "shop", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ids = [t["id"] for t in report["tables"]]
    assert ids == ["bronze", "events", "quarantine", "current", "deleted_keys"]
    assert not any(t["exists"] for t in report["tables"])
    assert all(t["txn_app_id"] is None for t in report["tables"])  # no identity before a run
    # silver runs inside bronze's batches: it has no checkpoint of its own
    assert list(report["checkpoints"]) == ["bronze"]
    state = FlowState.of(load_spec(spec_file), load_settings())
    assert report["state"]["status"] == str(state.status_file)

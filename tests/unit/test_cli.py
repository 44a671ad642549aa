"""The `conflux` console script's commands that need no Spark: validate, flows, status, stop."""

from pathlib import Path

import pytest
import yaml

from pipelines.cli import main
from pipelines.lease import FileLeaseStore, FlowLease
from pipelines.locations import FlowLocations
from pipelines.settings import load_settings
from pipelines.spec import load_spec


@pytest.fixture
def flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "flows"
    folder.mkdir()
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("CONFLUX_FLOWS_DIR", str(folder))
    return folder


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
    locations = FlowLocations.of(spec, load_settings())
    FlowLease("a", FileLeaseStore(locations.lease_dir), "cli-123", {"pid": "1"}).acquire()
    assert main(["flows"]) == 0
    assert "running (cli-123)" in capsys.readouterr().out
    assert main(["status", "a"]) == 0
    assert "owner cli-123" in capsys.readouterr().out
    assert main(["stop", "a", "--no-wait"]) == 0
    assert locations.stop_file("cli-123").exists()
    assert main(["status", "nope"]) == 2
    assert "no flow named 'nope'" in capsys.readouterr().err

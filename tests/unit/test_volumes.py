"""A full disk is named by its volume (:mod:`pipelines.volumes`): the mount point of a path, and a
REAL full disk, a small tmpfs filled to the last page, under Conflux's own file writes (a flow's
status file, its lease, the runner's report of a failure). No JVM; mounting needs root, which the
suite has here (the test says why it skips otherwise)."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from pipelines.catalog.state import FlowState
from pipelines.lease import FlowLease
from pipelines.messages import StopReason
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_FAILED, main, not_started
from pipelines.settings import load_settings
from pipelines.spec import load_spec
from pipelines.status import FlowStatus
from pipelines.stops import stop_reason
from pipelines.volumes import DiskFullError, VolumeFull, volume_of
from tests.support.disk import fill, tmpfs

NO_SPACE = os.strerror(errno.ENOSPC)


def test_the_volume_of_a_path_is_its_mount_point() -> None:
    assert volume_of("/") == "/"
    assert volume_of("/proc/self/status") == "/proc"  # through a symlink (/proc/self)
    assert volume_of("/proc/no/such/file") == "/proc"  # a file that could not be created
    assert volume_of("file:/proc/x") == "/proc"  # as Spark names a local table
    assert volume_of("s3a://lake/bronze/orders") == "s3a://lake/bronze/orders"  # not a volume
    unknown = VolumeFull.at(errno.ENOSPC, None)
    assert unknown.headline == "disk full on a volume the error does not name"


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """The runner's ``main`` installs its SIGTERM / SIGINT handlers: give pytest its own back."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def test_conflux_s_writes_on_a_full_disk_say_disk_full_on_the_volume_and_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "orders.yaml"
    topic = {"kind": "kafka", "topics": ["orders"]}
    spec_file.write_text(
        yaml.safe_dump({"name": "orders", "source": topic, "target": {"table": "orders"}})
    )
    spec = load_spec(spec_file)
    with tmpfs(tmp_path / "full disk") as volume:  # a space: mountinfo writes it as \040
        env = {"CONFLUX_RUNTIME_DIR": str(tmp_path), "CONFLUX_CHECKPOINTS_ROOT": str(volume)}
        state = FlowState.of(spec, load_settings(env))
        state.status_file.write_json(FlowStatus("launcher-a").to_json())
        written = state.status_file.read_bytes()
        lease = FlowLease("orders", state.lease_store(), "launcher-a", duration=60)
        term = lease.acquire()
        (state.checkpoint.path / "offsets").mkdir(parents=True)
        (state.checkpoint.path / "offsets" / "0").write_text("v1")  # the flow ran before
        fill(volume)

        # The status file: replaced atomically, so the old one stays whole.
        with pytest.raises(DiskFullError) as status_error:
            state.status_file.write_json(FlowStatus("launcher-b").to_json())
        assert str(status_error.value).startswith(
            f"disk full on {volume}: writing {state.status_file} failed ({NO_SPACE}); free space"
        )
        assert state.status_file.read_bytes() == written
        assert stop_reason(status_error.value) is StopReason.DISK_FULL

        # The lease: the next term cannot be written, and the held one is still the lease.
        with pytest.raises(DiskFullError) as lease_error:
            lease.renew()
        next_term = state.lease_dir / "term-0000000002.json"
        assert str(lease_error.value).startswith(f"disk full on {volume}: writing {next_term}")
        assert "hard link" not in str(lease_error.value)
        assert state.lease_store().latest() == term
        assert os.listdir(state.lease_dir.path) == ["term-0000000001.json"]  # no scratch left

        # The runner: its first write (the status it takes over) fails; it says so, in words.
        monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path))
        monkeypatch.setenv("CONFLUX_CHECKPOINTS_ROOT", str(volume))
        with signal_handlers_kept(), pytest.raises(SystemExit) as ended:
            main(["--spec", str(spec_file), "--lease-owner", "launcher-b"])
        assert ended.value.code == EXIT_FAILED
        errors = capsys.readouterr().err
        assert f"conflux: ERROR flows orders failed: disk full on {volume}: writing " in errors
        assert "failed to start" not in errors and "hard link" not in errors
        assert f"flow orders: its stop could not be recorded: disk full on {volume}" in errors
        assert state.status_file.read_bytes() == written

    # Where the status file has room, the stop is recorded as a full disk, with its volume.
    elsewhere = FlowState.of(spec, load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)}))
    reporter = Reporter()
    reporter.track_status({"orders": elsewhere.status_file}, owner="launcher-b")
    message = f"flows orders failed: {status_error.value}"
    not_started(reporter, ["orders"], status_error.value, message, EXIT_FAILED)
    recorded = FlowStatus.parse(json.loads(elsewhere.status_file.read_text())).stopped
    assert recorded is not None
    assert (recorded.reason, recorded.message) == (StopReason.DISK_FULL, message)

"""Fixtures of the unit tests (no JVM) that several modules share."""

from pathlib import Path

import pytest


@pytest.fixture
def flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty flows folder, the settings' (``CONFLUX_FLOWS_DIR``), with a runtime of its own."""
    folder = tmp_path / "flows"
    folder.mkdir()
    monkeypatch.setenv("CONFLUX_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("CONFLUX_FLOWS_DIR", str(folder))
    return folder

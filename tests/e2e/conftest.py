"""End-to-end fixtures: Dagster loading the real definitions and launching real Spark applications.

``conflux_env`` points the whole process (and so every spark-submit child) at a test runtime
folder, the session broker and a test flows folder, through the same CONFLUX_* variables a user
sets.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.settings import Settings
from tests.support.runtime import settings_env

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def conflux_env(spark_settings: Settings, tmp_path: Path) -> Iterator[Path]:
    """The test's flows folder; CONFLUX_* point at it and at the session's runtime and broker."""
    flows = tmp_path / "flows"
    flows.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in settings_env(spark_settings).items():
            if key.startswith("CONFLUX_"):
                patch.setenv(key, value)
        patch.setenv("CONFLUX_FLOWS_DIR", str(flows))
        yield flows

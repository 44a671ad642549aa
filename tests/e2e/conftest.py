"""End-to-end fixtures: Dagster loading the real definitions and launching real Spark applications.

``conflux_env`` points the whole process (and so every spark-submit child) at a test runtime
folder, the session broker and a test flows folder, through the same CONFLUX_* variables a user
sets. ``dagster_ui`` is ONE real `dagster dev` (web UI + daemon) shared by every e2e module, with
the same variables, its own flows folder (``ui_flows``) and a short flow lease
(:data:`LEASE_SECONDS`), so a dead run worker is noticed quickly.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.settings import Settings
from tests.support.dagster_ui import DagsterUI, dagster_dev
from tests.support.runtime import settings_env

HERE = Path(__file__).resolve().parent
#: CONFLUX_LEASE_SECONDS of the `dagster dev` runs: renewed every third, an orphan stops within it.
LEASE_SECONDS = 10.0


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
        patch.setenv("CONFLUX_LEASE_SECONDS", str(LEASE_SECONDS))
        yield flows


@pytest.fixture(scope="package")
def ui_flows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The flows folder of the shared `dagster dev`: tests add specs, then ``DagsterUI.reload``."""
    return tmp_path_factory.mktemp("ui-flows")


@pytest.fixture(scope="package")
def dagster_ui(
    spark_settings: Settings, ui_flows: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DagsterUI]:
    """`dagster dev` on a free loopback port with its own instance folder, for the whole package."""
    env = {
        **settings_env(spark_settings),
        "CONFLUX_FLOWS_DIR": str(ui_flows),
        "CONFLUX_LEASE_SECONDS": str(LEASE_SECONDS),
    }
    with dagster_dev(env, tmp_path_factory.mktemp("dagster_home")) as ui:
        yield ui

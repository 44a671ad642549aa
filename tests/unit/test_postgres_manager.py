"""The PostgreSQL manager's files, without a server: the Dagster instance it writes names the
database but holds no password (Dagster's UI shows the instance's configuration), the password
lives in owner-only files, and a lost password is never silently replaced."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.errors import ConfigError
from pipelines.settings import load_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "platform" / "postgres"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "platform" / "services"))

from server import PostgresPaths, credentials, write_dagster_instance, write_pgpass


def test_the_instance_names_the_database_and_the_password_stays_in_pgpass(
    tmp_path: Path,
) -> None:
    settings = load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)})
    paths = PostgresPaths.of(settings)
    password = credentials(paths)["password"]
    instance = write_dagster_instance(settings, paths)
    assert instance == tmp_path / "dagster-cluster" / "dagster.yaml"
    text = instance.read_text()
    assert password not in text
    config = yaml.safe_load(text)
    url = config["storage"]["postgres"]["postgres_url"]
    assert url.startswith("postgresql+psycopg2://conflux@127.0.0.1:") and url.endswith("/dagster")
    assert config["concurrency"]["pools"]["default_limit"] == 1  # the embedded instance's policy
    pgpass = write_pgpass(paths)
    assert pgpass.read_text().strip().endswith(f":conflux:{password}")
    for secret_file in (pgpass, paths.credentials, instance):
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600, secret_file


def test_a_lost_password_of_an_initialised_database_is_not_replaced(tmp_path: Path) -> None:
    paths = PostgresPaths.of(load_settings({"CONFLUX_RUNTIME_DIR": str(tmp_path)}))
    paths.data.mkdir(parents=True)
    (paths.data / "PG_VERSION").write_text("15\n")
    with pytest.raises(ConfigError, match=r"credentials\.json is missing but .* holds a database"):
        credentials(paths)

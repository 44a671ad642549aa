"""Flow-state storage without a server: which storage holds a location, what a misconfiguration
says, the S3 settings (the secret never shown), and the local store's failures told apart."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.settings import load_settings, settings_environment
from pipelines.storage import LocalStorage, S3Storage, join, split_s3, storage_for

ENV = {
    "CONFLUX_S3_ENDPOINT": "http://127.0.0.1:9000",
    "CONFLUX_S3_ACCESS_KEY_ID": "key",
    "CONFLUX_S3_SECRET_ACCESS_KEY": "very-secret",
}


def test_locations_pick_their_storage(tmp_path: Path) -> None:
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    connection = load_settings(ENV).s3_connection()
    assert isinstance(storage_for("s3a://lake/flows/orders", connection), S3Storage)
    assert split_s3("s3a://lake/flows/orders/_status.json") == ("lake", "flows/orders/_status.json")
    assert join("s3a://lake/flows/", "orders", "_lease") == "s3a://lake/flows/orders/_lease"


def test_misconfigured_locations_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="CONFLUX_S3_ACCESS_KEY_ID"):
        storage_for("s3a://lake/flows")
    with pytest.raises(ConfigError, match=r"cannot keep flow state on gs://"):
        storage_for("gs://lake/flows")
    with pytest.raises(ConfigError, match="not an S3 location"):
        split_s3("s3a:///no-bucket")


def test_the_secret_is_never_shown_and_reaches_child_processes() -> None:
    settings = load_settings(ENV)
    connection = settings.s3_connection()
    assert connection is not None and connection.secret_access_key == "very-secret"
    assert "very-secret" not in repr(settings) and "very-secret" not in repr(connection)
    child = load_settings(settings_environment(settings, base={}))
    assert child.s3_connection() == connection
    assert load_settings({}).s3_connection() is None


def test_a_local_create_without_hard_links_names_the_fix_and_a_full_disk_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage()

    def no_links(_source: str, _target: Path) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(ConfigError, match="needs a filesystem with hard links"):
        storage.create(str(tmp_path / "a.json"), b"{}")

    def full(_source: str, _target: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with pytest.raises(OSError, match="No space left on device") as error:
        storage.create(str(tmp_path / "a.json"), b"{}")
    assert not isinstance(error.value, ConfigError)
    assert [p.name for p in tmp_path.iterdir()] == []  # no scratch file left behind

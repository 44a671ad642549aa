"""Flow-state storage without a server: which storage holds a location, what a misconfiguration
says, the S3 settings (the secret never shown), and the local store's failures told apart."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from pipelines.messages import StopReason
from pipelines.settings import load_settings, settings_environment
from pipelines.stops import stop_reason
from pipelines.storage import LocalStorage, S3Storage, join, split_s3, storage_for
from pipelines.volumes import DiskFullError, volume_of

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


@pytest.mark.parametrize("number", [errno.EXDEV, errno.EPERM, errno.ENOTSUP])
def test_a_local_create_without_hard_links_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    """``link(2)``'s errors of a filesystem without hard links (injected: this host's disk has
    them) name that fix, and nothing of the attempt is left behind."""

    def no_links(_source: str, _target: Path) -> None:
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(ConfigError, match="needs a filesystem with hard links"):
        LocalStorage().create(str(tmp_path / "a.json"), b"{}")
    assert [p.name for p in tmp_path.iterdir()] == []  # no scratch file left behind


@pytest.mark.parametrize(
    ("number", "headline"), [(errno.ENOSPC, "disk full"), (errno.EDQUOT, "quota exceeded")]
)
def test_a_local_create_that_finds_no_space_says_so_with_the_volume_and_no_hard_link_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, number: int, headline: str
) -> None:
    """A new directory entry may need a block: ``link(2)`` then fails with ENOSPC (EDQUOT), which
    is a full volume, never "no hard links" (a real full disk: test_volumes.py)."""

    def full(_source: str, _target: Path) -> None:
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(os, "link", full)
    target = tmp_path / "lease" / "term-0000000001.json"
    with pytest.raises(DiskFullError) as error:
        LocalStorage().create(str(target), b"{}")
    message = str(error.value)
    assert message.startswith(f"{headline} on {volume_of(str(tmp_path))}: writing {target} failed")
    assert "hard link" not in message
    assert error.value.errno == number and stop_reason(error.value) is StopReason.DISK_FULL
    assert [p.name for p in target.parent.iterdir()] == []  # no scratch file left behind


class FakeS3:
    """An S3 client that honours If-None-Match (unless told to ignore it) and answers the next
    PUTs with the statuses ``script`` lists: an int raises that status; ``"lost"`` stores the
    object, then answers 412 (the retry of a PUT whose first answer was lost)."""

    def __init__(self, script: list[int | str] | None = None, honours: bool = True) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.script = list(script or [])
        self.honours = honours

    @staticmethod
    def error(status: int, operation: str) -> Exception:
        from botocore.exceptions import ClientError

        return ClientError({"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)  # fmt: skip

    def put_object(self, Bucket: str, Key: str, Body: bytes, **options: object) -> dict:  # noqa: N803
        metadata = dict(options.get("Metadata") or {})  # type: ignore[call-overload]
        step = self.script.pop(0) if self.script and not Key.startswith(".conflux-probe") else None
        if step == "lost":
            self.objects[Key] = (Body, metadata)
            raise self.error(412, "PutObject")
        if isinstance(step, int):
            raise self.error(step, "PutObject")
        if options.get("IfNoneMatch") == "*" and Key in self.objects and self.honours:
            raise self.error(412, "PutObject")
        self.objects[Key] = (Body, metadata)
        return {}

    def head_object(self, Bucket: str, Key: str) -> dict:  # noqa: N803
        if Key not in self.objects:
            raise self.error(404, "HeadObject")
        return {"Metadata": self.objects[Key][1]}

    def delete_object(self, Bucket: str, Key: str) -> dict:  # noqa: N803
        self.objects.pop(Key, None)
        return {}

    def get_paginator(self, _operation: str) -> FakeS3:
        return self

    def paginate(self, Bucket: str, Prefix: str) -> list[dict]:  # noqa: N803
        return [{"Contents": [{"Key": k} for k in sorted(self.objects) if k.startswith(Prefix)]}]

    def delete_objects(self, Bucket: str, Delete: dict) -> dict:  # noqa: N803
        """Deletes all but the keys in ``self.kept``, which it lists as errors (with a 200)."""
        errors = []
        for item in Delete["Objects"]:
            if item["Key"] in getattr(self, "kept", ()):
                errors.append({"Key": item["Key"], "Code": "AccessDenied", "Message": "no"})
            else:
                self.objects.pop(item["Key"], None)
        return {"Errors": errors} if errors else {}


def s3(client: FakeS3, name: str) -> S3Storage:
    """A storage on ``client``; its own endpoint, so each test checks conditional writes anew."""
    from pipelines.storage import S3Connection

    return S3Storage(S3Connection(f"http://{name}.test", "key", "secret"), client)


def test_a_retried_put_that_had_succeeded_is_ours_and_a_rivals_file_is_not() -> None:
    client = FakeS3(["lost"])
    assert s3(client, "lost").create("s3a://b/k", b"mine") is True
    client.objects["rival"] = (b"theirs", {"conflux-write-id": "someone-else"})
    assert s3(client, "lost").create("s3a://b/rival", b"mine") is False


def test_a_concurrent_conditional_write_is_waited_out_and_failures_are_io_errors() -> None:
    from pipelines.storage import StorageError

    assert s3(FakeS3([409, 409]), "busy").create("s3a://b/k", b"x") is True
    with pytest.raises(StorageError, match=r"the S3 store at http://down\.test failed") as error:
        s3(FakeS3([503]), "down").create("s3a://b/k", b"x")
    assert isinstance(error.value, OSError)  # the lease keeper rides it out like a disk error


def test_a_store_without_conditional_writes_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="does not honour conditional writes"):
        s3(FakeS3(honours=False), "ignores").create("s3a://b/k", b"x")
    with pytest.raises(ConfigError, match=r"If-None-Match.*AWS S3, s3proxy"):
        s3(FakeS3([501]), "refuses").create("s3a://b/k", b"x")


def test_keys_keep_every_character() -> None:
    assert split_s3("s3a://b/flows/a?b#c.json") == ("b", "flows/a?b#c.json")


def test_a_partial_delete_is_an_error_not_a_success() -> None:
    from pipelines.storage import StorageError

    client = FakeS3()
    for key in ("ck/offsets/0", "ck/offsets/1", "ck-other/x"):
        client.objects[key] = (b"", {})
    client.kept = {"ck/offsets/1"}  # type: ignore[attr-defined]
    with pytest.raises(StorageError, match=r"kept 1 of the objects to delete, e\.g\. ck/offsets/1"):
        s3(client, "partial").delete_tree("s3a://b/ck")
    assert set(client.objects) == {"ck/offsets/1", "ck-other/x"}  # a sibling prefix untouched

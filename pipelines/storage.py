"""Where flow-state files live: a local folder or an S3 bucket, behind one small interface.

A flow keeps small files beside its tables (identity, lease terms, status, health, the stop
channel; see :mod:`pipelines.catalog.state`). Two guarantees matter, and the interface states
them so that every store keeps them:

* :meth:`StateStorage.write` replaces a file so that a reader sees the old or the new content,
  never a part: a local file is written aside and renamed over; an S3 PUT is atomic by itself.
* :meth:`StateStorage.create` creates a file only if it does not exist, and of several racing
  creators exactly one wins, on every host that shares the store. Locally that is a hard link
  (``link(2)`` fails when the name exists); on S3 a PUT with ``If-None-Match: *``, which the store
  refuses with 412 when the key exists. A rename on S3 is a copy and an overwrite is silent, so
  nothing else gives it. One owner per flow (the lease) rests on this call.

Locations are URIs: ``s3a://bucket/key`` or ``s3://bucket/key`` on S3 (the scheme Spark's
Hadoop client reads); a plain path or ``file:`` URI on the local disk. Credentials never come
from a location: :class:`S3Connection` carries them, from the settings or the environment.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from pipelines.errors import ConfigError
from pipelines.volumes import naming_the_volume

S3_SCHEMES = ("s3a", "s3")
#: The object metadata key that tags a conditional create with its writer's one-off id, so a
#: retry of a PUT that had succeeded is told apart from a rival's file.
WRITE_ID = "conflux-write-id"
#: How often a conditional create is tried again while the store reports a concurrent one in
#: flight (S3: 409 ConditionalRequestConflict); it then answers 200 or 412.
CONFLICT_RETRIES = 5
#: What ``link(2)`` fails with on a filesystem without hard links (never ``ENOSPC`` or ``EDQUOT``:
#: those are a full volume, :class:`pipelines.volumes.DiskFullError`).
NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ENOSYS})


class StateStorage(Protocol):
    """Small files by URI (see the module doc for the guarantees)."""

    def read(self, uri: str) -> bytes | None:
        """The file's content; None if it does not exist."""
        ...

    def write(self, uri: str, data: bytes) -> None:
        """Create or replace the file atomically."""
        ...

    def create(self, uri: str, data: bytes) -> bool:
        """Create the file unless it exists; True if this call created it."""
        ...

    def list(self, uri: str) -> list[str]:
        """The names of the files directly in folder ``uri``, sorted (empty if none)."""
        ...

    def delete(self, uri: str) -> None:
        """Delete the file; nothing if it does not exist."""
        ...

    def exists(self, uri: str) -> bool:
        """Whether ``uri`` is a file, or a folder with anything in it."""
        ...

    def delete_tree(self, uri: str) -> None:
        """Delete the folder ``uri`` and everything in it; nothing if there is none."""
        ...

    def check(self, uri: str) -> None:
        """Fail, naming the fix, unless this store can keep ``uri`` with its guarantees (an S3
        bucket: reachable, and honouring conditional writes); cheap after the first call."""
        ...

    def move_tree(self, uri: str, target: str) -> None:
        """Move the folder (or file) ``uri`` to ``target``, which must not exist. Not atomic on
        S3 (a copy of each object, then a delete): callers hold the flow's lease."""
        ...


def is_s3(uri: str) -> bool:
    return urlparse(uri).scheme in S3_SCHEMES


def join(uri: str, *names: str) -> str:
    """``uri`` with ``names`` appended as path segments (for local paths and S3 URIs alike)."""
    return "/".join([uri.rstrip("/"), *names])


# --------------------------------------------------------------------------- local disk


class LocalStorage:
    """Files in folders of a POSIX filesystem (local disk, NFS with link semantics)."""

    @staticmethod
    def _path(uri: str) -> Path:
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file"):
            return Path(parsed.path if parsed.scheme else uri)
        raise ConfigError(f"{uri}: not a local path (a plain path or a file: URI)")

    def read(self, uri: str) -> bytes | None:
        try:
            return self._path(uri).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, uri: str, data: bytes) -> None:
        path = self._path(uri)
        with naming_the_volume(path):  # a full disk: "disk full on <mount point>"
            scratch = self._scratch(path, data)
            try:
                os.replace(scratch, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(scratch)
                raise

    def create(self, uri: str, data: bytes) -> bool:
        path = self._path(uri)
        with naming_the_volume(path):  # a full disk: "disk full on <mount point>"
            scratch = self._scratch(path, data)
            try:
                os.link(scratch, path)  # fails if the name exists: the conditional create
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in NO_HARD_LINKS:
                    raise  # a full disk (ENOSPC, EDQUOT: a new directory entry needs a block)
                raise ConfigError(
                    f"{path.parent}: cannot create files there by hard link ({exc}); flow state "
                    "needs a filesystem with hard links (local disk, NFS): point "
                    "CONFLUX_RUNTIME_DIR at one"
                ) from exc
            finally:
                os.unlink(scratch)
        return True

    def list(self, uri: str) -> list[str]:
        folder = self._path(uri)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name[0] != ".")

    def delete(self, uri: str) -> None:
        self._path(uri).unlink(missing_ok=True)

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def check(self, uri: str) -> None:
        self._path(uri)  # a local path; hard links are checked by the first create

    def delete_tree(self, uri: str) -> None:
        path = self._path(uri)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def move_tree(self, uri: str, target: str) -> None:
        destination = self._path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(self._path(uri), destination)

    @staticmethod
    def _scratch(path: Path, data: bytes) -> str:
        """``data`` fully written and synced to a hidden file beside ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            os.unlink(scratch)
            raise
        return scratch


# --------------------------------------------------------------------------- S3


@dataclass(frozen=True)
class S3Connection:
    """How to reach an S3-compatible store. The secret is never shown (not in ``repr``)."""

    endpoint: str | None
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = "us-east-1"

    def client(self, timeout: float | None = None) -> Any:
        """A boto3 S3 client (path-style addressing: a local server has no bucket DNS names);
        ``timeout``: seconds to connect and to read, one attempt (a health probe)."""
        import boto3
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
        if timeout is not None:
            config = config.merge(
                Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1})
            )
        # a session of its own: boto3's default session is not safe to build clients from threads
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=config,
        )

    def delta_rs_options(self) -> dict[str, str]:
        """The storage options delta-rs (``deltalake``) reaches this store with: path-style
        requests, plain HTTP only to an ``http://`` endpoint, and commits by conditional PUT
        (``If-None-Match``) as Conflux's Spark log store makes them."""
        options = {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
            "AWS_CONDITIONAL_PUT": "etag",
        }
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(self.endpoint.startswith("http://")).lower()
        return options


def split_s3(uri: str) -> tuple[str, str]:
    """``s3a://bucket/a/b`` -> ``("bucket", "a/b")``; the key as written (``?`` and ``#`` are
    characters of a key, not a query or a fragment)."""
    scheme, sep, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    if not sep or scheme not in S3_SCHEMES or not bucket:
        raise ConfigError(f"{uri}: not an S3 location (s3a://bucket/key)")
    return bucket, key


class StorageError(OSError):
    """The store failed a request (unreachable, refused, throttled): an I/O error like a local
    one, so callers that ride out a disk's I/O errors (the lease keeper) ride this one out too."""


#: (endpoint, bucket) pairs whose conditional writes this process has checked.
_PROBED: set[tuple[str | None, str]] = set()


def _status(exc: Exception) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (None for any other error)."""
    response = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _no_conditional_writes(uri: str) -> ConfigError:
    return ConfigError(
        f"{uri}: the S3 store does not honour conditional writes (If-None-Match: *); Conflux "
        "needs them for one writer per flow: use a store that has them (AWS S3, s3proxy with its "
        "filesystem backend, SeaweedFS)"
    )


class S3Storage:
    """Objects in an S3-compatible store that honours conditional writes (``If-None-Match``).

    The first conditional create in a bucket checks that the store honours them (a store that
    ignored the header would let every contender win): it creates a probe object twice and
    expects the second to be refused. botocore's errors surface as :class:`StorageError`.
    """

    def __init__(self, connection: S3Connection, client: Any | None = None) -> None:
        self.connection = connection
        self._client = client if client is not None else connection.client()

    @property
    def client(self) -> Any:
        """The boto3 client (for what the interface does not cover: listings with sizes, object
        metadata in tests and demos)."""
        return self._client

    def read(self, uri: str) -> bytes | None:
        bucket, key = split_s3(uri)
        with self._errors(uri):
            try:
                response = self._client.get_object(Bucket=bucket, Key=key)
            except Exception as exc:
                if _status(exc) == 404:
                    return None
                raise
            return bytes(response["Body"].read())

    def write(self, uri: str, data: bytes) -> None:
        bucket, key = split_s3(uri)
        with self._errors(uri):
            self._client.put_object(Bucket=bucket, Key=key, Body=data)

    def create(self, uri: str, data: bytes) -> bool:
        bucket, key = split_s3(uri)
        with self._errors(uri):
            self._check_conditional_writes(bucket)
            return self._create(uri, bucket, key, data)

    def _create(self, uri: str, bucket: str, key: str, data: bytes) -> bool:
        write_id = uuid.uuid4().hex
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self._client.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                    Metadata={WRITE_ID: write_id},
                )
                return True
            except Exception as exc:
                status = _status(exc)
                if status == 412:  # the key exists: ours only if a retried PUT had succeeded
                    return self._written_by(bucket, key, write_id)
                if status == 409 and attempt < CONFLICT_RETRIES:
                    time.sleep(0.05 * (attempt + 1))  # a concurrent conditional write in flight
                    continue
                if status == 501:
                    raise _no_conditional_writes(uri) from exc
                raise
        raise AssertionError("unreachable")

    def _written_by(self, bucket: str, key: str, write_id: str) -> bool:
        try:
            head = self._client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if _status(exc) == 404:  # deleted since (a prune): not ours to claim
                return False
            raise
        return bool(head.get("Metadata", {}).get(WRITE_ID) == write_id)

    def _check_conditional_writes(self, bucket: str) -> None:
        if (self.connection.endpoint, bucket) in _PROBED:
            return
        key = f".conflux-probe-{uuid.uuid4().hex}"
        probe = f"s3a://{bucket}/{key}"
        first = self._create(probe, bucket, key, b"probe")
        second = self._create(probe, bucket, key, b"probe")
        self._client.delete_object(Bucket=bucket, Key=key)
        if not first or second:
            raise _no_conditional_writes(f"s3a://{bucket}")
        _PROBED.add((self.connection.endpoint, bucket))

    def list(self, uri: str) -> list[str]:
        bucket, key = split_s3(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        names: list[str] = []
        with self._errors(uri):
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, Delimiter="/"
            ):
                names += [item["Key"][len(prefix) :] for item in page.get("Contents", [])]
        return sorted(name for name in names if name and name[0] != ".")

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        with self._errors(uri):
            self._client.delete_object(Bucket=bucket, Key=key)

    def check(self, uri: str) -> None:
        bucket, _key = split_s3(uri)
        with self._errors(uri):
            self._check_conditional_writes(bucket)

    def exists(self, uri: str) -> bool:
        bucket, key = split_s3(uri)
        key = key.rstrip("/")
        with self._errors(uri):
            if key:
                try:
                    self._client.head_object(Bucket=bucket, Key=key)
                    return True
                except Exception as exc:
                    if _status(exc) != 404:
                        raise
            folder = f"{key}/" if key else ""
            listed = self._client.list_objects_v2(Bucket=bucket, Prefix=folder, MaxKeys=1)
        return bool(listed.get("Contents"))

    def delete_tree(self, uri: str) -> None:
        with self._errors(uri):
            bucket, keys = _keys_under(self._client, uri)
            for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 keys at most
                chunk = [{"Key": key} for key in keys[start : start + 1000]]
                answer = self._client.delete_objects(Bucket=bucket, Delete={"Objects": chunk})
                failed = answer.get("Errors") or []  # a 200 may still list keys it kept
                if failed:
                    first = failed[0]
                    raise StorageError(
                        f"{uri}: the S3 store kept {len(failed)} of the objects to delete, e.g. "
                        f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                    )

    def move_tree(self, uri: str, target: str) -> None:
        source_prefix = split_s3(uri)[1].rstrip("/")
        target_bucket, target_prefix = split_s3(target)
        with self._errors(uri):
            bucket, keys = _keys_under(self._client, uri)
            for key in keys:
                self._client.copy_object(
                    Bucket=target_bucket,
                    Key=target_prefix.rstrip("/") + key[len(source_prefix) :],
                    CopySource={"Bucket": bucket, "Key": key},
                )
        self.delete_tree(uri)

    @contextlib.contextmanager
    def _errors(self, uri: str) -> Iterator[None]:
        """botocore's errors as :class:`StorageError`; Conflux's own pass through."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            endpoint = self.connection.endpoint or "AWS S3"
            raise StorageError(f"{uri}: the S3 store at {endpoint} failed: {exc}") from exc


def storage_for(uri: str, connection: S3Connection | None = None) -> StateStorage:
    """The storage that holds ``uri`` (``connection``: ``Settings.s3_connection()``).

    Raises:
        ConfigError: an S3 location without a connection, or a scheme Conflux cannot write.
    """
    scheme = urlparse(uri).scheme
    if scheme in ("", "file"):
        return LocalStorage()
    if scheme in S3_SCHEMES:
        if connection is None:
            raise ConfigError(
                f"{uri}: an S3 location needs the store's endpoint and credentials: set "
                "CONFLUX_S3_ENDPOINT, CONFLUX_S3_ACCESS_KEY_ID and CONFLUX_S3_SECRET_ACCESS_KEY"
            )
        return _s3_storage(connection)
    raise ConfigError(
        f"{uri}: Conflux cannot keep flow state on {scheme}:// (use a local path or s3a://)"
    )


def _keys_under(client: Any, uri: str) -> tuple[str, list[str]]:
    """The bucket and every key of the file ``uri`` or under the folder ``uri``."""
    bucket, key = split_s3(uri)
    prefix = key.rstrip("/")
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [
            item["Key"]
            for item in page.get("Contents", [])
            if item["Key"] == prefix or item["Key"].startswith(prefix + "/")
        ]
    return bucket, keys


@functools.cache
def _s3_storage(connection: S3Connection) -> S3Storage:
    """One storage (one boto3 client, which is thread-safe) per store and process."""
    return S3Storage(connection)

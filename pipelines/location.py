"""A location of a table or of a piece of flow state: one URI, and the storage that holds it.

The catalog hands out :class:`Location` values, never bare paths, so that a flow's tables and
state can live on the local disk or on an S3 store without any caller knowing which:

* Spark and Delta are given ``str(location)``: a plain path on the local disk (as before), an
  ``s3a://bucket/key`` URI on S3 (Hadoop's S3A client, with Conflux's conditional-write log store
  and checkpoint manager: :mod:`pipelines.spark`);
* Python code reads and writes flow-state files through the location's methods, which follow
  :class:`pathlib.Path`'s names where they mean the same thing, with the guarantees of
  :class:`pipelines.storage.StateStorage`: :meth:`write_bytes` replaces a file atomically and
  :meth:`create` is a create-if-absent of which exactly one racer wins, on every host.

On S3 a folder is a key prefix: it exists while something is in it, and ``mkdir`` does nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipelines.errors import ConfigError
from pipelines.storage import S3_SCHEMES, LocalStorage, S3Connection, StateStorage, storage_for

#: Schemes a location may have ('' is a plain path).
SCHEMES = ("", "file", *S3_SCHEMES)


def normalize(uri: str, base: Path | None = None) -> str:
    """``uri`` in the one form Conflux keeps, so that one place has one spelling: a local location
    as an absolute plain path (a ``file:`` URI, ``~`` and a path relative to ``base`` resolved;
    ``..`` kept as written, as flow identities recorded it), an S3 one as ``s3a://bucket/key``
    (``s3://`` read as ``s3a://``, repeated and trailing ``/`` dropped: S3A reads it so).

    Raises:
        ConfigError: a scheme Conflux cannot write (it names the ones it can), a ``file:`` URI
            naming another host.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme
    if scheme not in SCHEMES or (scheme in S3_SCHEMES and "://" not in uri):
        raise ConfigError(
            f"{uri}: Conflux keeps tables and flow state on the local disk (a path) or on an "
            "S3-compatible store (s3a://bucket/prefix), not on "
            f"{scheme or uri.partition(':')[0]}:"
        )
    if scheme in S3_SCHEMES:
        bucket, _, key = uri.partition("://")[2].partition("/")
        return "/".join(["s3a:/", bucket, *(part for part in key.split("/") if part)])
    if scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise ConfigError(f"{uri}: a file: URI names a local path (file:///path), not a host")
    path = Path(parsed.path if scheme == "file" else uri).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return str(path)


@dataclass(frozen=True)
class Location:
    """A file or folder of flow state, or a table's root (see the module doc)."""

    uri: str
    storage: StateStorage = field(compare=False, repr=False)

    @classmethod
    def of(cls, uri: str, connection: S3Connection | None = None) -> Location:
        """The location of ``uri`` (a path or an ``s3a://`` URI; ``connection`` for S3)."""
        uri = normalize(uri)
        return cls(uri, storage_for(uri, connection))

    @classmethod
    def local(cls, path: Path | str) -> Location:
        return cls(normalize(str(path)), LocalStorage())

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        """A local location is path-like (``open``, ``os`` and ``shutil`` take it); an S3 one
        is not, and says so instead of being misread as a relative path."""
        if not self.is_local:
            raise TypeError(f"{self.uri} is on an object store, not a local path")
        return self.uri

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.uri.rstrip('/')}/{name}", self.storage)

    def with_suffix_appended(self, suffix: str) -> Location:
        """The sibling named like this one plus ``suffix`` (``orders`` -> ``orders__refresh``)."""
        return Location(self.uri.rstrip("/") + suffix, self.storage)

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rpartition("/")[2]

    @property
    def parent(self) -> Location:
        return Location(self.uri.rstrip("/").rpartition("/")[0], self.storage)

    @property
    def is_local(self) -> bool:
        return isinstance(self.storage, LocalStorage)

    def delta_rs_options(self) -> dict[str, str]:
        """What delta-rs needs to open a table here: nothing locally, the store's connection
        on S3 (credentials included: pass it to delta-rs only, never log it)."""
        connection = getattr(self.storage, "connection", None)
        return connection.delta_rs_options() if isinstance(connection, S3Connection) else {}

    @property
    def path(self) -> Path:
        """The local path (for what only the local disk has: a lock, a process's log file)."""
        if not self.is_local:
            raise ConfigError(f"{self.uri}: not on the local disk")
        return Path(self.uri)

    # ----------------------------------------------------------------- reading

    def exists(self) -> bool:
        """A file, or a folder with anything in it (on S3 an empty folder does not exist)."""
        return self.storage.exists(self.uri)

    def read_bytes(self) -> bytes:
        data = self.storage.read(self.uri)
        if data is None:
            raise FileNotFoundError(f"{self.uri} does not exist")
        return data

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def check_store(self) -> None:
        """Fail, naming the fix, unless the store can keep this location with the guarantees
        one writer per flow rests on (on S3: reachable, conditional writes honoured)."""
        self.storage.check(self.uri)

    def names(self) -> list[str]:
        """The files directly in this folder, sorted (hidden ones left out)."""
        return self.storage.list(self.uri)

    # ----------------------------------------------------------------- writing

    def write_bytes(self, data: bytes) -> None:
        """Create or replace the file atomically: a reader sees the old or the new content."""
        self.storage.write(self.uri, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def write_json(self, payload: Mapping[str, Any]) -> None:
        """Replace the file with ``payload`` as JSON (atomically, as :meth:`write_bytes`)."""
        self.write_bytes(json.dumps(payload, default=str, indent=2, sort_keys=True).encode())

    def create(self, data: bytes = b"") -> bool:
        """Create the file unless it exists; True if this call created it (one racer wins)."""
        return self.storage.create(self.uri, data)

    def touch(self) -> None:
        """Make sure the file exists (an empty one if it did not)."""
        self.create(b"")

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Make the folder (and its parents) on the local disk; nothing on S3."""
        if self.is_local:
            self.path.mkdir(parents=parents, exist_ok=exist_ok)

    def unlink(self, missing_ok: bool = True) -> None:
        if not missing_ok and not self.exists():
            raise FileNotFoundError(f"{self.uri} does not exist")
        self.storage.delete(self.uri)

    def remove_tree(self) -> None:
        """Delete this folder and everything in it (nothing if it does not exist)."""
        self.storage.delete_tree(self.uri)

    def move_to(self, target: Location) -> None:
        """Move this folder or file to ``target`` (which must not exist), e.g. into an archive."""
        if type(target.storage) is not type(self.storage):
            raise ConfigError(f"cannot move {self.uri} to {target.uri}: another store")
        self.storage.move_tree(self.uri, target.uri)

"""A full disk, named by its volume: what a write that found no space says, in Python and Spark.

A write fails with ``ENOSPC`` when the filesystem is full and ``EDQUOT`` when the writer's quota
is used up. The file being written is rarely what a user needs to hear; the volume is: the mount
point that holds it, which ``df`` lists and which is what has to be given space. So every such
failure Conflux reports reads ``disk full on <mount point>`` (or ``quota exceeded on ...``):

* its own flow-state files (lease terms, status, heartbeat, identity: :mod:`pipelines.storage`)
  raise :class:`DiskFullError`, an ``OSError`` with the same errno, so code that rides out a
  store's I/O errors still does;
* a Spark write (a Delta table, a checkpoint) has no errno, only the operating system's text in
  a Java ``IOException``: :mod:`pipelines.stops` reads it and builds a :class:`VolumeFull` here.

The volume is the longest mount point of ``/proc/self/mountinfo`` that holds the path (Linux:
bind mounts included), else the nearest ancestor :func:`os.path.ismount` says is one; the path
itself when neither can be known (an object-store URI).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

#: The errors that mean "no space for this write", by what they are called.
FULL_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "quota exceeded"}
#: What each asks the user to do.
_FIXES = {
    errno.ENOSPC: "free space there (or move the flow's tables and state to a larger volume)",
    errno.EDQUOT: "raise the quota there or free space in it",
}
MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")


def _mount_points() -> list[str]:
    """The mount points of this process's mount namespace (empty: not Linux, or unreadable)."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    # Field 5 is the mount point, with space, tab, newline and backslash escaped in octal.
    points = [line.split(" ")[4] for line in lines if line.count(" ") >= 4]
    return [_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), point) for point in points]


def local_path(path: str) -> str | None:
    """``path`` as an absolute local path (a ``file:`` URI read as one); None: not local."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        path = parsed.path
    elif parsed.scheme:
        return None
    return os.path.abspath(path)


def volume_of(path: str) -> str:
    """The mount point of the volume that holds ``path`` (which need not exist: a file that
    could not be created); ``path`` itself when that cannot be known (not a local path)."""
    local = local_path(path)
    if local is None:
        return path
    existing = local
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing = os.path.dirname(existing)
    resolved = os.path.realpath(existing)
    holding = [
        point
        for point in _mount_points()
        if resolved == point or resolved.startswith(point.rstrip("/") + "/")
    ]
    if holding:
        return max(holding, key=len)
    while not os.path.ismount(resolved) and resolved != os.path.dirname(resolved):
        resolved = os.path.dirname(resolved)
    return resolved


@dataclass(frozen=True)
class VolumeFull:
    """A write found no space: which error (``ENOSPC`` or ``EDQUOT``), the file or table it was
    writing (None: the error did not say), and the volume holding it (None: unknown)."""

    errno: int
    path: str | None
    volume: str | None

    @classmethod
    def at(cls, number: int, path: str | None) -> VolumeFull:
        """The failure of a write to ``path`` (a local one shown as a plain path) with errno
        ``number``, its volume looked up now."""
        if not path:
            return cls(number, None, None)
        return cls(number, local_path(path) or path, volume_of(path))

    @property
    def headline(self) -> str:
        """``disk full on /data`` (what a user reads first)."""
        where = self.volume or "a volume the error does not name"
        return f"{FULL_ERRNOS[self.errno]} on {where}"

    def describe(self) -> str:
        """The headline, what was being written and the operating system's word, and the fix."""
        what = f"writing {self.path} failed" if self.path else "a write failed"
        return f"{self.headline}: {what} ({os.strerror(self.errno)}); {_FIXES[self.errno]}"


class DiskFullError(OSError):
    """A write of Conflux's own found no space (``errno`` ENOSPC or EDQUOT), naming the volume.

    An ``OSError`` with the original errno and file name, so ``except OSError`` (a lease check
    riding out one failed read) and :func:`pipelines.stops.stop_reason` treat it as before."""

    def __init__(self, full: VolumeFull) -> None:
        super().__init__(full.errno, os.strerror(full.errno), full.path)
        self.full = full

    def __str__(self) -> str:
        return self.full.describe()


def volume_full(exc: OSError) -> VolumeFull | None:
    """What ``exc`` says about a full volume (None: it is another error)."""
    if isinstance(exc, DiskFullError):
        return exc.full
    if exc.errno not in FULL_ERRNOS:
        return None
    path = exc.filename if isinstance(exc.filename, str) else None
    return VolumeFull.at(exc.errno, path)


@contextlib.contextmanager
def naming_the_volume(path: str | os.PathLike[str]) -> Iterator[None]:
    """Raise a write's ``ENOSPC`` / ``EDQUOT`` inside the block as :class:`DiskFullError` for
    ``path`` (the file the block writes); other errors pass through unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno not in FULL_ERRNOS:
            raise
        raise DiskFullError(VolumeFull.at(exc.errno, os.fspath(path))) from exc

"""A real full disk for tests: a small tmpfs, mounted for the test and filled to its last block.

Mounting needs root (the suite runs as root here); elsewhere the test is skipped, saying why."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(where: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (created); unmounted at the end, or detached at
    once (``--lazy``) while a process still holds a file on it open (a Spark writer that failed)."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a tmpfs needs root: this test runs as uid {os.geteuid()}")
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    subprocess.run(mount, check=True, capture_output=True)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True, capture_output=True)


def fill(volume: Path) -> None:
    """Write to a file on ``volume`` until the volume has no block left."""
    with open(volume / "filler", "wb", buffering=0) as handle, pytest.raises(OSError) as full:
        while True:
            handle.write(b"\xff" * 65536)  # the last one is short, the next one fails
    assert full.value.errno == errno.ENOSPC
    assert os.statvfs(volume).f_bavail == 0

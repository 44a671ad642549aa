"""Processes by group, read from ``/proc``: a Spark driver's JVM can outlive its Python parent,
so "the process exited" means "no live process of its group is left"."""

from __future__ import annotations

from pathlib import Path


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``; empty where there is no /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids

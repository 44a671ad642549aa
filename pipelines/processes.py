"""Processes read from ``/proc``: a Spark driver's JVM can outlive its Python parent, so "the
process exited" means "no live process of its group is left"; and a process killed with its
parent stays a zombie (it answers ``kill(pid, 0)``, runs nothing) until init reaps it."""

from __future__ import annotations

from pathlib import Path

#: ``/proc/<pid>/stat`` states of a process that has exited (zombie, dead) but may still be listed.
EXITED_STATES = ("Z", "X")


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (the state) on, or None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def exited(pid: int | str) -> bool:
    """Whether ``pid`` has exited but is not yet reaped (False when unknown or running)."""
    fields = stat_fields(pid)
    return bool(fields and fields[0] in EXITED_STATES)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``; empty where there is no /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(stat.parent.name)
        if fields and int(fields[2]) == pgid and fields[0] not in EXITED_STATES:
            pids.append(int(stat.parent.name))
    return pids

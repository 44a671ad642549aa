"""When a Delta table's rows became visible: its commits, read from ``_delta_log``.

Every ``NNN.json`` commit file lists the files it adds (``add.path``, with their row counts in
``add.stats``) and carries ``commitInfo`` with the commit's timestamp (ms). A table may be a local
path or a :class:`~pipelines.location.Location` (an ``s3a://`` one is read through its storage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipelines.location import Location


@dataclass(frozen=True)
class DataCommit:
    """A commit that added rows: when (``commitInfo.timestamp``, ms) and how many."""

    version: int
    timestamp_ms: int
    records: int


def location_of(table: Path | Location) -> Location:
    return table if isinstance(table, Location) else Location.local(table)


def commit_versions(table: Path | Location) -> list[int]:
    """The versions of the table's ``NNN.json`` commit files, in order."""
    names = (location_of(table) / "_delta_log").names()
    stems = [name.removesuffix(".json") for name in names if name.endswith(".json")]
    return sorted(int(stem) for stem in stems if stem.isdigit())


def commit_actions(table: Path | Location, version: int) -> list[dict]:
    """The actions of commit ``version`` (one JSON object per line of its log file)."""
    log = location_of(table) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def data_commits(table: Path | Location) -> list[DataCommit]:
    """Every commit of ``table`` that added rows, in version order (rows from ``add.stats``)."""
    commits = []
    for version in commit_versions(table):
        timestamp, records = None, 0
        for action in commit_actions(table, version):
            if "commitInfo" in action:
                timestamp = int(action["commitInfo"]["timestamp"])
            elif "add" in action and action["add"].get("stats"):
                records += int(json.loads(action["add"]["stats"])["numRecords"])
        if records and timestamp is not None:
            commits.append(DataCommit(version, timestamp, records))
    return commits

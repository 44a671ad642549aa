"""When each data file of a Delta table became visible: its commit, read from ``_delta_log``.

Every ``NNN.json`` commit file lists the files it adds (``add.path``) and carries ``commitInfo``
with the commit's timestamp (ms). A row is visible to readers from the commit that added its file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    file_mtime_ms: float


def file_name(path: str) -> str:
    """The last part of a data file path or URI (part files have unique names)."""
    return unquote(path).rstrip("/").rsplit("/", 1)[-1]


def read_commit(log_file: Path) -> tuple[Commit, list[str]]:
    """The commit of one ``_delta_log/NNN.json`` file and the names of the files it adds."""
    timestamp, added = None, []
    for line in log_file.read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            timestamp = int(action["commitInfo"]["timestamp"])
        elif "add" in action:
            added.append(file_name(action["add"]["path"]))
    if timestamp is None:
        raise ValueError(f"{log_file} has no commitInfo")
    mtime = log_file.stat().st_mtime * 1000
    return Commit(int(log_file.stem), timestamp, mtime), added


def commits_by_file(table: Path) -> dict[str, Commit]:
    """Data file name → the commit that added it, for every commit of ``table``."""
    result = {}
    for log_file in sorted((table / "_delta_log").glob("*.json")):
        commit, added = read_commit(log_file)
        result.update(dict.fromkeys(added, commit))
    return result


@dataclass(frozen=True)
class DataCommit:
    """A commit that added rows: when (``commitInfo.timestamp``, ms) and how many."""

    version: int
    timestamp_ms: int
    records: int


def data_commits(table: Path) -> list[DataCommit]:
    """Every commit of ``table`` that added rows, in version order (rows from ``add.stats``)."""
    commits = []
    for log_file in sorted((table / "_delta_log").glob("*.json")):
        timestamp, records = None, 0
        for line in log_file.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                timestamp = int(action["commitInfo"]["timestamp"])
            elif "add" in action and action["add"].get("stats"):
                records += int(json.loads(action["add"]["stats"])["numRecords"])
        if records and timestamp is not None:
            commits.append(DataCommit(int(log_file.stem), timestamp, records))
    return commits

"""When a Delta table's rows became visible: its commits, read from ``_delta_log``.

Every ``NNN.json`` commit file lists the files it adds (``add.path``, with their row counts in
``add.stats``) and carries ``commitInfo`` with the commit's timestamp (ms).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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

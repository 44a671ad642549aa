"""The benchmark report: Markdown for people, JSON for tools."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness import Outcome

RESULTS_HEADER = "| benchmark | metric | value | notes |\n|---|---|---|---|"


def key_value_table(values: dict[str, str]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in values.items()]
    return "\n".join(lines)


def results_table(outcomes: dict[str, Outcome]) -> str:
    rows = [row.markdown() for outcome in outcomes.values() for row in outcome.rows]
    return "\n".join([RESULTS_HEADER, *rows])


def run_header(title: str, meta: dict[str, Any]) -> list[str]:
    """The title, the exact command with its wall time, the machine and the versions of a run."""
    return [
        title,
        f"Command: `{meta['command']}` (wall time {meta['wall_seconds'] / 60:.0f} min)",
        "### Machine",
        key_value_table(meta["machine"]),
        "### Versions",
        key_value_table(meta["versions"]),
    ]


def markdown_block(meta: dict[str, Any], outcomes: dict[str, Outcome]) -> str:
    parts = [
        *run_header(f"## Conflux benchmark, {meta['started_at']}", meta),
        "### Results",
        results_table(outcomes),
    ]
    for name, outcome in outcomes.items():
        if outcome.extra:
            parts += [f"### {name}: {outcome.extra_title}", outcome.extra]
    return "\n\n".join(parts)


def document(meta: dict[str, Any], outcomes: dict[str, Outcome]) -> dict[str, Any]:
    """Everything a run measured, as plain data (what ``--json`` writes)."""
    return json.loads(json.dumps({
        **meta,
        "results": {name: outcome.data for name, outcome in outcomes.items()},
        "rows": [asdict(row) for outcome in outcomes.values() for row in outcome.rows],
    }, default=str))  # fmt: skip


def write_json(path: Path, meta: dict[str, Any], outcomes: dict[str, Outcome]) -> None:
    path.write_text(json.dumps(document(meta, outcomes), indent=2) + "\n")

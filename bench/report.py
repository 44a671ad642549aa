"""The benchmark report: Markdown for people, JSON for tools."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness import Outcome, Row

RESULTS_HEADER = "| benchmark | metric | value | notes |\n|---|---|---|---|"


def key_value_table(values: dict[str, str]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in values.items()]
    return "\n".join(lines)


def side_by_side_rows(benchmark: str, data: dict[str, Any], names: tuple[str, str],
                      titles: tuple[str, str], label: str) -> list[Row]:  # fmt: skip
    """Result rows of a ``comparison`` whose lines hold ``names[0]`` and ``names[1]``'s figures
    (``bench/store.py``, ``bench/cluster.py``); ``titles`` name them for people."""
    left, right = names
    result = []
    for c in data["comparison"]:
        a, b = c["format"].format(c[left]), c["format"].format(c[right])
        result.append(Row(benchmark, f"{c['measure']}: {titles[0]} / {titles[1]} "
                                     f"({right} / {left})",
                          f"{a} / {b} {c['unit']} ({c['ratio']:.2f}x)",
                          f"{c['size']}; {label}"))  # fmt: skip
    return result


def side_by_side_table(data: dict[str, Any], names: tuple[str, str],
                       titles: tuple[str, str]) -> list[str]:  # fmt: skip
    """The Markdown table of the same ``comparison``: measure, size, both figures, their ratio."""
    left, right = names
    lines = [f"| measure | size | {titles[0]} | {titles[1]} * | {right} / {left} |",
             "|---|---|---|---|---|"]  # fmt: skip
    for c in data["comparison"]:
        a, b = c["format"].format(c[left]), c["format"].format(c[right])
        ratio = f"{c['ratio']:.2f}" if c[left] else "—"
        lines.append(f"| {c['measure']} | {c['size']} | {a} {c['unit']} | {b} {c['unit']} "
                     f"| {ratio} |")  # fmt: skip
    return lines


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

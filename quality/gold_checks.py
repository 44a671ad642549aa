"""Dagster asset checks of a gold table, fed by the batches of its two queries.

On each gold asset (see :mod:`pipelines.stages.gold`):

* ``rows_accounted`` (ERROR): every split batch adds up: the rows the split query read (Spark's
  ``numInputRows``) are the rows it counted, ``rows in = on time + late + quarantined +
  filtered`` (rows a join side's ``where`` leaves out), and the
  input and late-data commits added those rows (unless replays Delta skipped);
* ``late_rows`` (WARN): no row of the run arrived behind the watermark. Late rows are kept in
  the late-data table, so this is a to-do, not a loss: a backfill of their dates reconciles them;
  its metadata names the watermark and the count;
* ``watermark_drops`` (ERROR): Spark's stateful query dropped no row by its watermark, which is
  what Conflux's split guarantees (its watermark is never below Spark's; for a join running
  beside its split, within the margin :mod:`pipelines.gold.joins` describes). A failure would
  mean rows reached neither gold nor the late table (they stay in the input table, and a
  backfill of their dates recomputes them from the events).

Like :class:`quality.checks.StreamChecks`, the run's totals are logged as evaluations while the
run goes on and yielded as results once at its end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    MetadataValue,
)

from pipelines.catalog.roles import TableRole, role_of
from pipelines.spec import AnyGold

ROWS_ACCOUNTED = "rows_accounted"
LATE_ROWS = "late_rows"
WATERMARK_DROPS = "watermark_drops"
_COUNTS = ("rows_in", "on_time", "late", "quarantined", "filtered")


def gold_check_specs(gold: AnyGold, key: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(
            name=ROWS_ACCOUNTED,
            asset=key,
            description="Every row each split batch read went on time to gold's input, late to "
            f"{gold.late.table}, or to the quarantine (or was left out by a join side's where), "
            "as Spark's and Delta's own counts show.",
        ),
        AssetCheckSpec(
            name=LATE_ROWS,
            asset=key,
            description=f"No row arrived behind the watermark (allowed_lateness "
            f"{gold.allowed_lateness}); late rows are kept in {gold.late.table} until a "
            "backfill of their dates.",
        ),
        AssetCheckSpec(
            name=WATERMARK_DROPS,
            asset=key,
            description="Spark's stateful query dropped no row by its watermark (Conflux's own "
            "watermark split every late row off first).",
        ),
    ]


def split_problems(message: Mapping[str, Any]) -> list[str]:
    """What does not add up in one split batch message."""
    quality = message["quality"]
    problems = []
    parts = sum(
        int(quality.get(name) or 0) for name in ("on_time", "late", "quarantined", "filtered")
    )
    if int(quality["rows_in"]) != parts:
        problems.append(
            f"{quality['rows_in']} rows in, but {parts} on time + late + quarantined + filtered"
        )
    read = message.get("input_rows")
    if read is not None and int(read) != int(quality["rows_in"]):
        problems.append(f"the query read {read} rows, the split counted {quality['rows_in']}")
    expected = {TableRole.GOLD_INPUT: int(quality["on_time"]), TableRole.LATE: int(quality["late"])}
    for write in message.get("writes") or []:
        kind = role_of(str(write.get("role", "")))
        if kind in expected and not write.get("skipped") and int(write["rows"]) != expected[kind]:
            problems.append(f"the {kind} commit added {write['rows']} rows, not {expected[kind]}")
    return problems


@dataclass
class GoldChecks:
    """The run's totals of one gold table's checks."""

    gold: AnyGold
    key: AssetKey
    batches: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    failed: dict[str, list[int]] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropped: int = 0
    watermark: str | None = None

    def add(self, message: Mapping[str, Any]) -> bool:
        """Count one batch message of the table's split or stateful query; True when a check's
        status changed."""
        before = {name: self.passed(name) for name in (ROWS_ACCOUNTED, LATE_ROWS, WATERMARK_DROPS)}
        batch_id = int(message["batch_id"])
        if str(message.get("stage", "")).endswith(".split"):
            quality = message["quality"]
            self.batches += 1
            for name in _COUNTS:
                self.counts[name] = self.counts.get(name, 0) + int(quality.get(name) or 0)
            self.watermark = quality.get("next_watermark") or self.watermark
            problems = split_problems(message)
            self.last[ROWS_ACCOUNTED] = {"batch_id": batch_id, "problems": problems}
            if problems:
                self.failed.setdefault(ROWS_ACCOUNTED, []).append(batch_id)
            if int(quality.get("late") or 0):
                self.failed.setdefault(LATE_ROWS, []).append(batch_id)
            self.last[LATE_ROWS] = {"batch_id": batch_id, "late": int(quality.get("late") or 0)}
        state = message.get("state") or {}
        dropped = int(state.get("rows_dropped_by_watermark") or 0)
        if state:
            self.dropped += dropped
            self.last[WATERMARK_DROPS] = {"batch_id": batch_id, "dropped": dropped}
            if dropped:
                self.failed.setdefault(WATERMARK_DROPS, []).append(batch_id)
        return any(before[name] != self.passed(name) for name in before)

    def passed(self, name: str) -> bool:
        return not self.failed.get(name)

    def _outcomes(self) -> list[dict[str, Any]]:
        totals = {name: MetadataValue.int(value) for name, value in self.counts.items()}
        descriptions = {
            ROWS_ACCOUNTED: "every split batch adds up"
            if self.passed(ROWS_ACCOUNTED)
            else "split batches that do not add up",
            LATE_ROWS: f"{self.counts.get('late', 0)} late row(s) kept in {self.gold.late.table}"
            f"; watermark {self.watermark}",
            WATERMARK_DROPS: f"{self.dropped} row(s) dropped by Spark's watermark",
        }
        severities = {
            ROWS_ACCOUNTED: AssetCheckSeverity.ERROR,
            LATE_ROWS: AssetCheckSeverity.WARN,
            WATERMARK_DROPS: AssetCheckSeverity.ERROR,
        }
        return [
            {
                "asset_key": self.key,
                "check_name": name,
                "passed": self.passed(name),
                "severity": severities[name],
                "metadata": {
                    "batches": MetadataValue.int(self.batches),
                    **totals,
                    "watermark": MetadataValue.text(str(self.watermark)),
                    "failed_batches": MetadataValue.json(self.failed.get(name, [])[-20:]),
                    "last_batch": MetadataValue.json(self.last.get(name, {})),
                },
                "description": f"run so far: {self.batches} split batch(es); {descriptions[name]}",
            }
            for name in (ROWS_ACCOUNTED, LATE_ROWS, WATERMARK_DROPS)
        ]

    def evaluations(self) -> list[AssetCheckEvaluation]:
        return [AssetCheckEvaluation(**outcome) for outcome in self._outcomes()]

    def results(self) -> list[AssetCheckResult]:
        return [AssetCheckResult(**outcome) for outcome in self._outcomes()]

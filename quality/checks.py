"""Dagster asset checks of a flow's silver stage, fed by the batches of the running stream.

Each silver batch reports where its rows went and what its expectations found
(:class:`pipelines.silver.expectations.BatchQuality`, in the batch's progress message). On the
flow's events asset that becomes:

* one check per expectation, ``expectation_<name>``: it passes for a batch in which no row failed
  the expectation; a failure has severity WARN for ``warn`` and ``drop`` expectations (the
  stream goes on; dropped rows are in the quarantine with the expectation's name) and ERROR for
  ``fail`` ones (the flow stopped before writing the batch);
* ``rows_accounted``: every row of the batch is an event, a quarantined row or an ignored
  Debezium tombstone (ERROR if not: rows would have vanished).

A step may yield each check's result once, and a continuous run lasts for days: so the launcher
logs one :class:`~dagster.AssetCheckEvaluation` per batch and check as an event while the run goes
on (:func:`batch_evaluations`), and yields one :class:`~dagster.AssetCheckResult` per check at
the end with the run's totals (:func:`run_results`).
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

from pipelines.silver.expectations import QUALITY_COUNTS
from pipelines.spec import Expectation, FlowSpec

ROWS_ACCOUNTED = "rows_accounted"


def expectation_check_name(expectation: Expectation) -> str:
    return f"expectation_{expectation.name}"


def _severity(action: str) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if action == "fail" else AssetCheckSeverity.WARN


def stream_check_specs(spec: FlowSpec, events: AssetKey) -> list[AssetCheckSpec]:
    """The checks the flow's silver batches report on its events asset (none without silver)."""
    if spec.silver is None:
        return []
    specs = [
        AssetCheckSpec(
            name=ROWS_ACCOUNTED,
            asset=events,
            description="Every row of each silver batch is an event, a quarantined row or an "
            "ignored Debezium tombstone: nothing vanishes.",
        )
    ]
    for expectation in spec.silver.expectations:
        specs.append(
            AssetCheckSpec(
                name=expectation_check_name(expectation),
                asset=events,
                description=f"Rows meet {expectation.describe()} (action {expectation.action}: "
                + {
                    "warn": "failing rows are kept and counted",
                    "drop": "failing rows go to the quarantine",
                    "fail": "a failing row stops the flow before its batch is written",
                }[expectation.action]
                + ").",
            )
        )
    return specs


def batch_evaluations(
    events: AssetKey, batch_id: int, quality: Mapping[str, Any]
) -> list[AssetCheckEvaluation]:
    """The check evaluations of one silver batch's ``quality`` report."""
    rows_in = int(quality["rows_in"])
    accounted = int(quality["events"]) + int(quality["quarantined"]) + int(quality["ignored"])
    counts = {name: MetadataValue.int(int(quality[name])) for name in QUALITY_COUNTS}
    evaluations = [
        AssetCheckEvaluation(
            asset_key=events,
            check_name=ROWS_ACCOUNTED,
            passed=rows_in == accounted,
            severity=AssetCheckSeverity.ERROR,
            metadata={"batch_id": MetadataValue.int(batch_id), **counts},
            description=f"batch {batch_id}: {rows_in} rows in = {quality['events']} events + "
            f"{quality['quarantined']} quarantined + {quality['ignored']} ignored",
        )
    ]
    for outcome in quality.get("expectations") or []:
        failed = int(outcome["failed"])
        evaluations.append(
            AssetCheckEvaluation(
                asset_key=events,
                check_name=f"expectation_{outcome['name']}",
                passed=failed == 0,
                severity=_severity(str(outcome["action"])),
                metadata={
                    "batch_id": MetadataValue.int(batch_id),
                    "failed_rows": MetadataValue.int(failed),
                    "rows_judged": MetadataValue.int(
                        int(quality["events"]) + int(quality["dropped"])
                    ),
                    "action": MetadataValue.text(str(outcome["action"])),
                    "expectation": MetadataValue.text(str(outcome["expectation"])),
                },
                description=f"batch {batch_id}: {failed} row(s) failed",
            )
        )
    return evaluations


@dataclass
class CheckTotals:
    """A run's totals of one flow's stream checks, for the results yielded at its end."""

    events: AssetKey
    batches: int = 0
    unaccounted_batches: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    actions: dict[str, str] = field(default_factory=dict)

    def add(self, batch_id: int, quality: Mapping[str, Any]) -> None:
        self.batches += 1
        for evaluation in batch_evaluations(self.events, batch_id, quality):
            if evaluation.check_name == ROWS_ACCOUNTED and not evaluation.passed:
                self.unaccounted_batches.append(batch_id)
        for name in QUALITY_COUNTS:
            self.counts[name] = self.counts.get(name, 0) + int(quality[name])
        for outcome in quality.get("expectations") or []:
            name = f"expectation_{outcome['name']}"
            self.failed[name] = self.failed.get(name, 0) + int(outcome["failed"])
            self.actions[name] = str(outcome["action"])

    def metadata(self) -> dict[str, Any]:
        """The run's counts as ``quality_*`` materialization metadata (none before a batch)."""
        counts = {
            **self.counts,
            **{f"failed_{k[len('expectation_') :]}": v for k, v in self.failed.items()},
        }
        return {f"quality_{name}": MetadataValue.int(value) for name, value in counts.items()}


def run_results(spec: FlowSpec, totals: CheckTotals) -> list[AssetCheckResult]:
    """One result per stream check of ``spec``, over the batches of the run."""
    metadata = {
        "batches": MetadataValue.int(totals.batches),
        **{name: MetadataValue.int(value) for name, value in totals.counts.items()},
    }
    results = [
        AssetCheckResult(
            asset_key=totals.events,
            check_name=ROWS_ACCOUNTED,
            passed=not totals.unaccounted_batches,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                **metadata,
                "unaccounted_batches": MetadataValue.json(totals.unaccounted_batches),
            },
        )
    ]
    assert spec.silver is not None
    for expectation in spec.silver.expectations:
        name = expectation_check_name(expectation)
        failed = totals.failed.get(name, 0)
        results.append(
            AssetCheckResult(
                asset_key=totals.events,
                check_name=name,
                passed=failed == 0,
                severity=_severity(expectation.action),
                metadata={
                    **metadata,
                    "failed_rows": MetadataValue.int(failed),
                    "action": MetadataValue.text(expectation.action),
                    "expectation": MetadataValue.text(expectation.describe()),
                },
            )
        )
    return results


def failed_evaluation(
    events: AssetKey, expectation: Expectation, error: str
) -> AssetCheckEvaluation:
    """The evaluation of a ``fail`` expectation that stopped the flow (its batch never committed,
    so no batch report carries it): failed, ERROR, with the error naming a failing row."""
    return AssetCheckEvaluation(
        asset_key=events,
        check_name=expectation_check_name(expectation),
        passed=False,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "action": MetadataValue.text(expectation.action),
            "expectation": MetadataValue.text(expectation.describe()),
            "error": MetadataValue.text(error),
        },
        description="the flow stopped: a row failed this expectation (nothing of the batch was "
        "written)",
    )

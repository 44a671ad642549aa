"""Dagster asset checks of a flow's silver stage, fed by the batches of the running stream.

Each silver batch reports where its rows went and what its expectations found
(:class:`pipelines.silver.expectations.BatchQuality`, in the batch's progress message). On the
flow's events asset that becomes:

* one check per expectation, ``expectation_<name>``: it passes while no row of the run failed
  the expectation; a failure has severity WARN for ``warn`` and ``drop`` expectations (the
  stream goes on; dropped rows are in the quarantine with the expectation's name) and ERROR for
  ``fail`` ones (the flow stopped before writing the batch);
* ``schema_changes`` (WARN): records that changed schema in a way the policy does not take in
  (``silver.schema_changes``: a value of another type than declared, a declared column missing,
  undeclared fields under ``new_columns: quarantine``) are quarantined with the change named, and
  the stream goes on; columns evolved into the tables are listed in its metadata (they pass); a
  ``fail`` policy that stopped the flow fails it;
* ``rows_accounted``: every batch's rows are accounted for against what Spark and Delta saw:
  the rows the silver query read (its progress' ``numInputRows``) are the rows the stage
  counted, and the rows the events and quarantine commits added (when not replays) are the
  events written (after the transform) and the quarantined rows (ERROR if not).

Dagster keeps one status per check and run, and a step may yield each check's result only once,
while a continuous run lasts for days. So :class:`StreamChecks` keeps the run's totals and the
launcher logs them as :class:`~dagster.AssetCheckEvaluation` events while the run goes on (run so
far, with the last batch's figures): at once when a check's status changes, otherwise at most
once per progress interval; at the end of the run it yields them as
:class:`~dagster.AssetCheckResult` (:meth:`StreamChecks.results`). A failed batch is therefore
never hidden by a later passing one. Launching one of these checks alone from the UI runs the
whole flow: they are part of the flow's multi-asset (one Spark application), not separate steps.
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
from pipelines.silver.expectations import QUALITY_COUNTS
from pipelines.spec import Expectation, FlowSpec

ROWS_ACCOUNTED = "rows_accounted"
#: Materialization metadata: the first batch of the run that wrote the table (with
#: ``last_batch_id``, the batches a GX suite with ``scope: run`` checks).
RUN_FIRST_BATCH_ID = "run_first_batch_id"
SCHEMA_CHANGES = "schema_changes"
_ACTIONS = {
    "warn": "failing rows are kept and counted",
    "drop": "failing rows go to the quarantine",
    "fail": "a failing row stops the flow before its batch is written",
}


def expectation_check_name(expectation: Expectation) -> str:
    return f"expectation_{expectation.name}"


def _severity(action: str) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if action == "fail" else AssetCheckSeverity.WARN


def stream_check_specs(spec: FlowSpec, events: AssetKey) -> list[AssetCheckSpec]:
    """The checks the flow's silver batches report on its events asset (none without silver)."""
    if spec.silver is None:
        return []
    return [
        AssetCheckSpec(
            name=ROWS_ACCOUNTED,
            asset=events,
            description="Every row each silver batch read is an event written, a quarantined "
            "row or an ignored Debezium tombstone, as Spark's and Delta's own counts show.",
        ),
        AssetCheckSpec(
            name=SCHEMA_CHANGES,
            asset=events,
            description="No record holds a value of another type than the spec declares (a "
            "column's type changed upstream): such records are quarantined and this check warns.",
        ),
        *(
            AssetCheckSpec(
                name=expectation_check_name(e),
                asset=events,
                description=f"Rows meet {e.describe()} (action {e.action}: {_ACTIONS[e.action]}).",
            )
            for e in spec.silver.expectations
        ),
    ]


def accounting_problems(message: Mapping[str, Any]) -> list[str]:
    """What does not add up in one silver batch message (its ``quality`` and its ``writes``)."""
    quality = message["quality"]
    problems = []
    parts = int(quality["events"]) + int(quality["quarantined"]) + int(quality["ignored"])
    if int(quality["rows_in"]) != parts:
        problems.append(f"{quality['rows_in']} rows in, but {parts} events + quarantined + ignored")
    read = message.get("input_rows")
    if read is not None and int(read) != int(quality["rows_in"]):
        problems.append(f"the query read {read} rows, the stage counted {quality['rows_in']}")
    expected = {
        TableRole.EVENTS: int(quality["written"]),
        TableRole.QUARANTINE: int(quality["quarantined"]),
    }
    for write in message.get("writes") or []:
        role = role_of(str(write.get("role")))
        if role in expected and not write.get("skipped") and int(write["rows"]) != expected[role]:
            problems.append(f"the {role} commit added {write['rows']} rows, not {expected[role]}")
    return problems


@dataclass
class _Check:
    name: str
    severity: AssetCheckSeverity
    description: str
    failed_rows: int = 0
    failed_batches: list[int] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failed_batches


@dataclass
class StreamChecks:
    """The run's totals of one flow's stream checks, as evaluations while it runs and results
    at its end (see the module doc)."""

    spec: FlowSpec
    events: AssetKey
    batches: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    checks: dict[str, _Check] = field(default_factory=dict)
    columns_added: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.spec.silver is not None
        self.checks[ROWS_ACCOUNTED] = _Check(
            ROWS_ACCOUNTED, AssetCheckSeverity.ERROR, "rows accounted for"
        )
        self.checks[SCHEMA_CHANGES] = _Check(
            SCHEMA_CHANGES, AssetCheckSeverity.WARN, "records match the declared schema"
        )
        for expectation in self.spec.silver.expectations:
            name = expectation_check_name(expectation)
            self.checks[name] = _Check(
                name, _severity(expectation.action), f"{expectation.describe()}"
            )

    def add(self, message: Mapping[str, Any]) -> bool:
        """Count one silver batch message; True when a check's status changed."""
        before = {name: check.passed for name, check in self.checks.items()}
        batch_id, quality = int(message["batch_id"]), message["quality"]
        self.batches += 1
        for name in QUALITY_COUNTS:
            self.counts[name] = self.counts.get(name, 0) + int(quality.get(name) or 0)
        problems = accounting_problems(message)
        accounted = self.checks[ROWS_ACCOUNTED]
        accounted.last = {"batch_id": batch_id, "problems": problems}
        if problems:
            accounted.failed_batches.append(batch_id)
        mismatches = int(quality.get("schema_mismatches") or 0)
        added = list(quality.get("columns_added") or [])
        self.columns_added += added
        schema = self.checks[SCHEMA_CHANGES]
        schema.last = {"batch_id": batch_id, "failed_rows": mismatches, "columns_added": added}
        schema.failed_rows += mismatches
        if mismatches:
            schema.failed_batches.append(batch_id)
        for outcome in quality.get("expectations") or []:
            check = self.checks.get(f"expectation_{outcome['name']}")
            if check is None:  # an expectation the spec no longer has (a spec changed mid-run)
                continue
            failed = int(outcome["failed"])
            check.last = {"batch_id": batch_id, "failed_rows": failed}
            check.failed_rows += failed
            if failed:
                check.failed_batches.append(batch_id)
        return any(before[name] != check.passed for name, check in self.checks.items())

    def fail_schema_change(self, error: str) -> None:
        """A ``fail`` schema-change policy stopped the flow (its batch never committed)."""
        check = self.checks[SCHEMA_CHANGES]
        check.failed_batches.append(-1)
        check.severity = AssetCheckSeverity.ERROR  # the stream stopped: no longer a warning
        check.last = {"error": error}

    def fail_expectation(self, name: str, error: str) -> None:
        """A ``fail`` expectation stopped the flow (its batch never committed: no message)."""
        check = self.checks[f"expectation_{name}"]
        check.failed_batches.append(-1)
        check.last = {"error": error}

    def metadata(self) -> dict[str, Any]:
        """The run's counts as ``quality_*`` materialization metadata (none before a batch)."""
        failed = {
            f"failed_{name[len('expectation_') :]}": check.failed_rows
            for name, check in self.checks.items()
            if name.startswith("expectation_")
        }
        counts = {**self.counts, **failed} if self.batches else {}
        return {f"quality_{name}": MetadataValue.int(value) for name, value in counts.items()}

    def _metadata(self, check: _Check) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "batches": MetadataValue.int(self.batches),
            **{name: MetadataValue.int(value) for name, value in self.counts.items()},
            "failed_batches": MetadataValue.json(check.failed_batches[-20:]),
            "last_batch": MetadataValue.json(check.last),
        }
        if check.name != ROWS_ACCOUNTED:
            metadata["failed_rows"] = MetadataValue.int(check.failed_rows)
            metadata["expectation"] = MetadataValue.text(check.description)
        if check.name == SCHEMA_CHANGES:
            metadata["columns_added"] = MetadataValue.json(self.columns_added)
        return metadata

    def _description(self, check: _Check) -> str:
        if check.name == ROWS_ACCOUNTED:
            status = "every batch adds up" if check.passed else "batches that do not add up"
        elif check.name == SCHEMA_CHANGES:
            status = f"{check.failed_rows} record(s) quarantined for a schema change"
            if self.columns_added:
                status += f"; columns evolved: {', '.join(self.columns_added)}"
        else:
            status = f"{check.failed_rows} row(s) failed"
        return f"run so far: {self.batches} batch(es); {status}"

    def _outcomes(self) -> list[dict[str, Any]]:
        return [
            {
                "asset_key": self.events,
                "check_name": check.name,
                "passed": check.passed,
                "severity": check.severity,
                "metadata": self._metadata(check),
                "description": self._description(check),
            }
            for check in self.checks.values()
        ]

    def evaluations(self) -> list[AssetCheckEvaluation]:
        """The run so far, one evaluation per check (logged while the run goes on)."""
        return [AssetCheckEvaluation(**outcome) for outcome in self._outcomes()]

    def results(self) -> list[AssetCheckResult]:
        """The whole run, one result per check (yielded once, when the run ends)."""
        return [AssetCheckResult(**outcome) for outcome in self._outcomes()]

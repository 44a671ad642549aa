"""The maintenance part of a spec: OPTIMIZE and VACUUM of a flow's tables, and when they run."""

from __future__ import annotations

from pydantic import Field, StrictBool, field_validator

from .base import _error, _Model
from .values import Cron, Retention, _days


class MaintenanceSpec(_Model):
    """Table maintenance of the flow's Delta tables (a Dagster job per flow, and `conflux
    maintain FLOW`): OPTIMIZE compacts the small files streaming commits leave, VACUUM removes
    the files no table version within the retention needs."""

    schedule: Cron | None = Field(
        default=None,
        description="When the maintenance job runs (cron, UTC), e.g. `0 3 * * *`; default: "
        "only when launched.",
    )
    optimize: StrictBool = Field(default=True, description="Run OPTIMIZE on every table.")
    vacuum: StrictBool = Field(default=True, description="Run VACUUM on every table.")
    vacuum_retention: Retention = Field(
        default="7 days",
        description="Keep removed files at least this long (Delta's minimum: 7 days); raised "
        "for a table that a stream of the flow has not read up to yet. Readers of the change "
        "data feed outside Conflux must not fall further behind than this.",
    )

    @field_validator("vacuum_retention")
    @classmethod
    def _at_least_a_week(cls, retention: str) -> str:
        if _days(retention) < 7:
            raise _error(
                f"{retention!r} is below Delta's minimum of 7 days: streams that restart from "
                "an older version, and time travel, need the files"
            )
        return retention

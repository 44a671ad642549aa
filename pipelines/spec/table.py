"""A Delta table a spec declares: its name, location, Delta features, properties and layout.

The base of every silver and gold table (:class:`SilverTable`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from .base import _error, _Model
from .expectations import TableSuite
from .values import Identifier, StringMap, TableLocation, _days

#: Table properties a spec field of its own sets (``properties`` may not set them too).
FEATURE_PROPERTIES = {
    "delta.enableChangeDataFeed": "change_data_feed",
    "delta.enableDeletionVectors": "deletion_vectors",
    "delta.columnMapping.mode": "column_mapping",
}
#: Properties whose shortening could let a replayed batch be written twice, or a stream lose files.
_GUARDED_PROPERTIES = ("delta.setTransactionRetentionDuration", "delta.logRetentionDuration")


class SilverTable(_Model):
    """A silver table: its name, optionally its location, and the Delta features it uses.

    Features left out get the role's default (see each table); a feature switched on later is
    switched on at the next start (``ALTER TABLE ... SET TBLPROPERTIES``); switching deletion
    vectors or column mapping off again is Delta's to refuse.
    """

    table: Identifier = Field(description="Name of the table.")
    path: TableLocation | None = Field(
        default=None,
        description=(
            "Location of the table: a path (absolute, or relative to the runtime folder) or "
            "`s3a://bucket/prefix`; default: `<lake>/silver/<table>`."
        ),
    )
    change_data_feed: StrictBool | None = Field(
        default=None,
        description="Record row-level changes (Delta's change data feed, "
        "`delta.enableChangeDataFeed`); default: on for current-state and history tables.",
    )
    deletion_vectors: StrictBool | None = Field(
        default=None,
        description="Mark deleted and updated rows in deletion vectors instead of rewriting "
        "files (`delta.enableDeletionVectors`): faster MERGEs; delta-rs reads such tables "
        "through its `QueryBuilder`. Default: on for current-state and history tables.",
    )
    column_mapping: Literal["none", "name"] | None = Field(
        default=None,
        description="Delta column mapping (`delta.columnMapping.mode`): `name` allows renaming "
        "and dropping columns without rewriting the table. Default: none.",
    )
    properties: StringMap = Field(
        default_factory=dict,
        description="Further Delta table properties, e.g. `delta.logRetentionDuration: "
        "interval 60 days`.",
    )
    z_order_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Columns OPTIMIZE Z-orders the files by (table maintenance); not with "
        "`cluster_by`.",
    )
    cluster_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Liquid clustering columns (set when the table is created; OPTIMIZE "
        "clusters by them); not with partitioning or `z_order_by`.",
    )
    suite: TableSuite | None = Field(
        default=None,
        description="Great Expectations checks of the whole table (not null, unique, values in "
        "set, between, row count, freshness), run as a Dagster asset check.",
    )

    @field_validator("properties")
    @classmethod
    def _own_properties(cls, properties: dict[str, str]) -> dict[str, str]:
        for key in properties:
            if key in FEATURE_PROPERTIES:
                raise _error(f"{key!r} has a field of its own: use {FEATURE_PROPERTIES[key]}")
            if key.startswith("conflux."):
                raise _error(f"{key!r}: conflux.* properties are Conflux's own records")
            if key in _GUARDED_PROPERTIES and _days(properties[key]) < 7:
                raise _error(
                    f"{key!r} = {properties[key]!r}: Conflux's exactly-once replays and its "
                    "streams need at least 7 days (`interval 7 days`); give a longer interval"
                )
        return properties

    @model_validator(mode="after")
    def _check_layout(self) -> SilverTable:
        if self.cluster_by and self.z_order_by:
            raise _error("give cluster_by or z_order_by, not both", "cluster_by")
        return self

    def stated_properties(self) -> dict[str, str]:
        """The table properties the spec states itself (no role defaults): what a start applies
        to an existing table, so a new default never upgrades a table's protocol unasked."""
        stated = {
            key: ("true" if value else "false") if isinstance(value, bool) else value
            for key, value in (
                ("delta.enableChangeDataFeed", self.change_data_feed),
                ("delta.enableDeletionVectors", self.deletion_vectors),
                ("delta.columnMapping.mode", self.column_mapping),
            )
            if value is not None
        }
        return {**stated, **self.properties}

    def delta_properties(
        self, *, change_data_feed: bool = False, deletion_vectors: bool = False
    ) -> dict[str, str]:
        """The table properties this spec asks for; the keyword arguments are the role's defaults."""
        features = {
            "delta.enableChangeDataFeed": _on(self.change_data_feed, change_data_feed),
            "delta.enableDeletionVectors": _on(self.deletion_vectors, deletion_vectors),
        }
        if self.column_mapping is not None:
            features["delta.columnMapping.mode"] = self.column_mapping
        return {**features, **self.properties}


def _on(value: bool | None, default: bool) -> str:
    return "true" if (default if value is None else value) else "false"

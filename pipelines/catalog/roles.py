"""The roles a table plays in a flow, and the layers they belong to: the only place that knows
them by name.

A role is what a table *is for* (the bronze landing table, silver's parsed events, a gold table's
late rows, ...). Roles that exist once per gold table (``GOLD``, ``GOLD_INPUT``, ``LATE``,
``BACKFILLS``) are told apart by the gold table's name. Outside this package code compares roles
as enum members, never as strings; the string form (:func:`role_id`) only exists because it is
what earlier versions wrote into progress messages and ``_status.json``, and what maps a table to
its Dagster asset.

This module imports nothing of Conflux, so the spec models can use it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Layer(StrEnum):
    """The medallion layer a table belongs to."""

    BRONZE = "bronze"
    SILVER = "silver"
    GOLD = "gold"


class TableRole(StrEnum):
    """What a table of a flow is for. The value is the role's id in messages and status files."""

    #: The raw records, exactly as the source delivered them (the spec's ``target``).
    BRONZE = "bronze"
    #: Silver's parsed, append-only events.
    EVENTS = "events"
    #: Records silver could not parse or that an expectation dropped, with their reasons.
    QUARANTINE = "quarantine"
    #: The current state per key (``silver.current``).
    CURRENT = "current"
    #: The current table's side table: keys deleted, with the sequence that deleted them.
    DELETED_KEYS = "deleted_keys"
    #: Every version of every key (SCD type 2, ``silver.history``).
    HISTORY = "history"
    #: A gold table (an aggregate or a join), one per ``gold:`` entry.
    GOLD = "gold"
    #: The on-time rows a gold table's stateful query reads (written by its split).
    GOLD_INPUT = "gold_input"
    #: Rows that arrived after a gold table's watermark.
    LATE = "late"
    #: The append-only record of a gold table's backfills.
    BACKFILLS = "gold_backfills"

    @property
    def layer(self) -> Layer:
        if self is TableRole.BRONZE:
            return Layer.BRONZE
        return Layer.GOLD if self in PER_GOLD_TABLE else Layer.SILVER

    @property
    def per_gold_table(self) -> bool:
        """Whether a flow has one table of this role per gold table."""
        return self in PER_GOLD_TABLE

    @property
    def asset_prefix(self) -> str | None:
        """The first part of the Dagster asset key of a table of this role (None: a side table,
        part of another table's asset)."""
        return _ASSET_PREFIX.get(self)

    @property
    def name_field(self) -> str:
        """The spec field that names a table of this role, for messages."""
        return _NAME_FIELD[self]


PER_GOLD_TABLE = frozenset(
    {TableRole.GOLD, TableRole.GOLD_INPUT, TableRole.LATE, TableRole.BACKFILLS}
)

_ASSET_PREFIX = {
    TableRole.BRONZE: "bronze",
    TableRole.EVENTS: "silver",
    TableRole.CURRENT: "silver",
    TableRole.HISTORY: "silver",
    TableRole.QUARANTINE: "quarantine",
    TableRole.GOLD: "gold",
    TableRole.LATE: "late",
}

_NAME_FIELD = {
    TableRole.BRONZE: "target",
    TableRole.EVENTS: "silver.events.table",
    TableRole.QUARANTINE: "silver.quarantine.table",
    TableRole.CURRENT: "silver.current.table",
    TableRole.DELETED_KEYS: "silver.current.table",
    TableRole.HISTORY: "silver.history.table",
    TableRole.GOLD: "gold.table",
    TableRole.GOLD_INPUT: "gold.table",
    TableRole.LATE: "gold.late.table",
    TableRole.BACKFILLS: "gold.table",
}


def role_id(role: TableRole, gold: str | None = None) -> str:
    """The id of a table in progress messages, status files and the maps keyed by table:
    the role's value, ``<role>/<gold table>`` for a role held once per gold table."""
    if role.per_gold_table:
        assert gold, f"a {role} table belongs to a gold table"
        return f"{role.value}/{gold}"
    return role.value


def role_of(table_id: str) -> TableRole | None:
    """The role of a table id in a message, or None for a write that is not to one of the
    flow's own tables by role (e.g. a gold split's appends to the quarantine)."""
    try:
        return parse_role_id(table_id)[0]
    except ValueError:
        return None


def parse_role_id(table_id: str) -> tuple[TableRole, str | None]:
    """(role, gold table) of an id written by :func:`role_id`.

    Raises:
        ValueError: not a table id.
    """
    role, _, gold = table_id.partition("/")
    parsed = TableRole(role)
    if parsed.per_gold_table != bool(gold):
        raise ValueError(f"{table_id!r} is not a table id")
    return parsed, gold or None


def gold_quarantine_id(gold: str) -> str:
    """The id under which a gold table's split reports its appends to the flow's quarantine
    (kept apart from silver's own quarantine writes in the split's totals)."""
    return f"gold_quarantine/{gold}"


class DeclaredTable(NamedTuple):
    """A table the spec declares (by its name): its id (:func:`role_id`) and its name. The
    catalog adds where it lives and the side tables kept beside it."""

    id: str
    name: str

    @classmethod
    def of(cls, role: TableRole, name: str, gold: str | None = None) -> DeclaredTable:
        return cls(role_id(role, gold), name)

    @property
    def role(self) -> TableRole:
        return parse_role_id(self.id)[0]

    @property
    def gold(self) -> str | None:
        """The gold table a per-gold-table role belongs to."""
        return parse_role_id(self.id)[1]


#: The stage kind of the bronze and silver stages (their query is ``<flow>`` / ``<flow>.silver``).
BRONZE_STAGE = "bronze"
SILVER_STAGE = "silver"


def gold_stage(gold_table: str, split: bool = False) -> str:
    """The stage kind of a gold table's stateful query (``gold.<table>``) or of its split
    (``gold.<table>.split``): also the last part of the query's name."""
    return f"gold.{gold_table}.split" if split else f"gold.{gold_table}"


def is_gold_stage(stage: str) -> bool:
    return stage.startswith("gold.")

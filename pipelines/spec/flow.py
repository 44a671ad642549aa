"""The whole spec of a flow (:class:`FlowSpec`): its parts, and the checks across them.

The tables a spec declares (:meth:`FlowSpec.tables`) are named with the catalog's roles
(:mod:`pipelines.catalog.roles`, which imports nothing of Conflux); everything derived from them
(locations, side tables, asset keys, app ids) is the catalog's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from pydantic import Field, StrictStr, ValidationInfo, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from pipelines.catalog.roles import DeclaredTable, TableRole

from .base import _error, _Model, _raise_all
from .bronze import FileSource, KafkaSource, Source, Target, Trigger
from .columns import EVENT_METADATA_COLUMNS, GOLD_INPUT_METADATA
from .ddl import _ddl_types
from .gold import GoldJoinSpec, GoldSpec, GoldTable
from .maintenance import MaintenanceSpec
from .references import reference_problem
from .silver import SilverSpec
from .values import IDENTIFIER_RE, Identifier, Owner, TagMap


class FlowSpec(_Model):
    """A validated flow: ``source`` into the bronze table ``target``, optionally on into silver."""

    _internal_fields: ClassVar[tuple[str, ...]] = ("spec_file",)

    name: Identifier = Field(
        description="Name of the flow (unique): its Dagster assets, checkpoint folder and query."
    )
    description: StrictStr = Field(default="", description="What the flow carries, for people.")
    domain: Identifier | None = Field(
        default=None,
        description="The business domain the flow belongs to: the Dagster asset group of its "
        "tables and sources; default: the flow's name.",
    )
    owners: tuple[Owner, ...] = Field(
        default=(),
        description="Who answers for the flow's tables: emails or `team:<name>` (Dagster owners).",
    )
    tags: TagMap = Field(
        default_factory=dict,
        description="Tags of every asset of the flow, e.g. `{tier: critical}` (Dagster tags: "
        "keys and values of letters, digits, `_`, `-`, `.`; at most 63 characters).",
    )
    source: Source = Field(discriminator="kind", description="Where the records come from.")
    target: Target = Field(description="The bronze Delta table.")
    trigger: Trigger = Field(
        default=Trigger(), description="When micro-batches run; default: `available_now`."
    )
    silver: SilverSpec | None = Field(
        default=None, description="Parse the payloads into silver tables (Kafka sources only)."
    )
    gold: tuple[GoldTable, ...] = Field(
        default=(),
        description="Gold tables: windowed aggregates of the silver events by event time, or "
        "stream-stream joins of them (needs `silver`).",
    )
    maintenance: MaintenanceSpec = Field(
        default=MaintenanceSpec(),
        description="OPTIMIZE and VACUUM of the flow's tables, and when they run.",
    )
    spec_file: SkipJsonSchema[str] = Field(
        default="<inline>", description="The file the spec was read from (set by the loader)."
    )

    @classmethod
    def _prepare(cls, data: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.context and "where" in info.context:
            data["spec_file"] = info.context["where"]
        silver, name = data.get("silver"), data.get("name")
        if isinstance(silver, dict) and isinstance(name, str) and IDENTIFIER_RE.match(name):
            defaults = {
                role: {"table": f"silver_{name}_{role}"}
                for role in ("events", "quarantine")
                if silver.get(role) is None
            }
            data["silver"] = {**silver, **defaults}
        return data

    @model_validator(mode="after")
    def _check(self) -> FlowSpec:
        """The parts fit together (every problem at once, each gold table's too)."""
        _raise_all(
            (
                *self._part_problems(),
                *(e for i, g in enumerate(self.gold) for e in self._gold_problems(g, f"gold.{i}")),
            ),
            type(self).__name__,
        )
        return self

    def _part_problems(self) -> Iterator[PydanticCustomError]:
        if isinstance(self.source, FileSource) and "topic" in self.target.partition_by:
            yield _error("a files source has no topic column", "target.partition_by")
        if self.silver is not None and not isinstance(self.source, KafkaSource):
            yield _error(
                "silver parses Kafka payloads; a files source lands typed columns in bronze "
                "already: silver over files is not supported yet",
                "silver",
            )
        source = self.source
        if (
            self.silver is not None
            and self.silver.debezium.truncate == "apply"
            and isinstance(source, KafkaSource)
            and (source.pattern or len(source.topics) > 1)
        ):
            yield _error(
                "applies a TRUNCATE to every row of the flow, so the flow must read one table: "
                "one topic (a TRUNCATE of one shard's table would empty the others'); read "
                "several with truncate: quarantine, or give each its own flow",
                "silver.debezium.truncate",
            )
        seen: dict[str, str] = {}
        for declared in self.tables():
            table, role = declared.name, declared.role
            if table in seen:
                yield _error(
                    f"{table!r} is already the {seen[table]} table; give each table of a flow "
                    "its own name",
                    role.name_field + (".table" if role is TableRole.BRONZE else ""),
                )
            seen.setdefault(table, declared.id)

    def _gold_problems(
        self, gold: GoldSpec | GoldJoinSpec, field: str
    ) -> Iterator[PydanticCustomError]:
        if self.silver is None:
            yield _error("gold reads the silver events: declare a silver stage", field)
            return
        if isinstance(gold, GoldSpec):
            yield from self.event_column_problems(gold.input_columns(), gold.event_time, field)
            return
        left = gold.join.left
        yield from self.event_column_problems(
            gold.side_columns("left"), left.event_time, f"{field}.join.left", left.where
        )
        if gold.join.right_flow(self.name) == self.name:
            right = gold.join.right
            yield from self.event_column_problems(
                gold.side_columns("right"), right.event_time, f"{field}.join.right", right.where
            )

    def check_event_columns(
        self, columns: Iterable[str], event_time: str, field: str, where: str | None = None
    ) -> None:
        """Raise the first of :meth:`event_column_problems`."""
        for problem in self.event_column_problems(columns, event_time, field, where):
            raise problem

    def event_column_problems(
        self, columns: Iterable[str], event_time: str, field: str, where: str | None = None
    ) -> Iterator[PydanticCustomError]:
        """``columns`` and the TIMESTAMP ``event_time`` are columns of the flow's silver events,
        and the SQL condition ``where`` names only columns of its events table (all unknown
        until start when a transform may add columns)."""
        silver = self.silver
        if silver is None:
            yield _error(f"flow {self.name} has no silver stage, so no events to read", field)
            return
        if silver.transform is not None:
            return  # the transform may add columns: the stage finds out at start
        types = {**_ddl_types(silver.schema_ddl), "_event_time": "timestamp"}
        names = ", ".join(dict.fromkeys((*types, *GOLD_INPUT_METADATA)))
        known = f"columns of the events of flow {self.name}: {names}"
        for column in dict.fromkeys((*columns, event_time)):
            if column not in types and column not in GOLD_INPUT_METADATA:
                yield _error(f"{column!r} is not one of the {known}", field)
        kind = types.get(event_time, "a metadata column")
        known_column = event_time in types or event_time in GOLD_INPUT_METADATA
        if known_column and not kind.startswith(("timestamp", "date")):
            yield _error(
                f"{event_time!r} is {kind}; the event time must be a TIMESTAMP column",
                f"{field}.event_time",
            )
        if where is not None:
            problem = reference_problem(
                where,
                silver.columns(),
                EVENT_METADATA_COLUMNS,
                of=f"the events of flow {self.name}",
            )
            if problem is not None:
                yield _error(problem, f"{field}.where")

    def tables(self) -> list[DeclaredTable]:
        """Every table the flow declares, in order: bronze, silver's, then each gold table's
        (the table, then its late-data table)."""
        tables = [DeclaredTable.of(TableRole.BRONZE, self.target.table)]
        silver = self.silver
        if silver is not None:
            tables += [
                DeclaredTable.of(TableRole.EVENTS, silver.events.table),
                DeclaredTable.of(TableRole.QUARANTINE, silver.quarantine.table),
            ]
            if silver.current is not None:
                tables.append(DeclaredTable.of(TableRole.CURRENT, silver.current.table))
            if silver.history is not None:
                tables.append(DeclaredTable.of(TableRole.HISTORY, silver.history.table))
        for gold in self.gold:
            tables += [
                DeclaredTable.of(TableRole.GOLD, gold.table, gold.table),
                DeclaredTable.of(TableRole.LATE, gold.late.table, gold.table),
            ]
        return tables

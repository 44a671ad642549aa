"""The late-data table of a gold table: what a late row holds, and how a table of an older layout
is brought up to it.

A late row is the silver events row that arrived late, **whole**, beside what the gold stage knew
of it. Its silver row is kept in a struct (its columns under their own names, so none of them can
be mistaken for a column the late table keeps itself: the events' ``_event_time`` is the silver
event time, the late table's ``_event_time`` the time the gold table judged the row by):

* windowed aggregates: ``_event`` (:data:`EVENT_ROW`), every column of the events table in its
  order; the aggregation's input columns, the event time and the coordinates stay top-level too;
* joins: ``_left`` or ``_right`` by the row's side (the other one null), every column of that
  side's events table, the join's keys and the side's columns first (the input table's struct
  of the same name holds only those).

The split carries the whole row beside its input columns (:func:`whole_row_column`), so the row
it writes late is the very row it read.

**Tables of an older layout.** A late table written before late rows kept their silver row lacks
``_event``, or its ``_left`` / ``_right`` hold only the join's columns; after a silver schema
evolution the events have a column more. :func:`grow_late_table` brings such a table (of this
flow) up to the layout before the split's first batch, by Delta's schema evolution: one empty
append with ``mergeSchema`` adds the missing columns and struct fields, so the table's rows so far
read null there (their silver rows are in the events table, at their coordinates). Anything else
(a field removed or retyped) is no growth: the table check refuses it, naming the reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    LongType,
    StructField,
    StructType,
    TimestampType,
)

from pipelines.catalog.tables import CatalogTable
from pipelines.delta_writes import retry_on_maintenance, table_properties
from pipelines.errors import ConfigError
from pipelines.identity import FLOW_ID_PROPERTY, FlowIdentity

#: The column of a windowed aggregate's late table that holds the late silver events row whole.
EVENT_ROW = "_event"


def whole_row_column(name: str) -> str:
    """The split's own column that carries the whole silver row the late table keeps in ``name``
    (never written to the input table)."""
    return f"_whole{name}"


def whole_row_type(events: StructType, first: Sequence[str] = ()) -> StructType:
    """Every column of an events table as one struct type: ``first`` first, then the others in
    the table's order. Each field nullable and without metadata: fields a grown table gained are
    so (:func:`grow_late_table`), and the other side's struct of a join row is null anyway."""
    names = dict.fromkeys((*first, *events.fieldNames()))
    return StructType([StructField(name, events[name].dataType, True) for name in names])


def whole_row(row_type: StructType) -> Column:
    """The struct of ``row_type``'s columns of the row, in its order."""
    return F.struct(*(F.col(f"`{field.name}`") for field in row_type.fields))


def row_types(late: StructType, names: Iterable[str]) -> dict[str, StructType]:
    """The whole-row columns ``names`` of the late table's schema ``late`` -> their types."""
    types = {}
    for name in names:
        row_type = late[name].dataType
        assert isinstance(row_type, StructType), f"{name}: {row_type}"
        types[name] = row_type
    return types


def late_columns(missed: Sequence[StructField] = ()) -> StructType:
    """The columns the late table keeps itself besides the input's: the event date (which
    partitions it), the watermark at arrival, ``missed`` (windowed aggregates: the window the row
    missed), the split batch and when it was written."""
    return StructType(
        [
            StructField("_event_date", DateType()),
            StructField("_watermark", TimestampType()),
            *missed,
            StructField("_split_batch_id", LongType()),
            StructField("_late_at", TimestampType()),
        ]
    )


def late_rows(
    late: DataFrame, inputs: Sequence[str], whole: Iterable[str], watermark: Column,
    missed: Sequence[Column], batch_id: int,
) -> DataFrame:  # fmt: skip
    """A split batch's ``late`` rows as the late table holds them (:func:`late_schema`): the
    input columns ``inputs``, the whole silver rows ``whole`` the split carried
    (:func:`whole_row_column`), the event date, the ``watermark`` each was judged by, what it
    ``missed``, the batch."""
    carried = {name: F.col(whole_row_column(name)).alias(name) for name in whole}
    return late.select(
        *(carried.get(c, F.col(c)) for c in inputs),
        F.to_date("_event_time").alias("_event_date"),
        watermark.alias("_watermark"),
        *missed,
        F.lit(batch_id).cast("bigint").alias("_split_batch_id"),
        F.current_timestamp().alias("_late_at"),
        *(column for name, column in carried.items() if name not in inputs),
    )


def late_schema(
    input_schema: StructType, missed: Sequence[StructField], whole: Mapping[str, StructType],
    where: str,
) -> StructType:  # fmt: skip
    """The late table's columns: the input table's (a whole-row struct of ``whole`` in place of
    the input's struct of its name), its own (:func:`late_columns`), then the whole-row structs
    the input has not.

    Raises:
        ConfigError: an input column has the name of one the late table keeps itself.
    """
    inputs, own = input_schema.fieldNames(), late_columns(missed)
    kept = [*own.fieldNames(), *(name for name in whole if name not in inputs)]
    clash = [name for name in inputs if name in kept]
    if clash:
        raise ConfigError(
            f"{where}: the silver column {', '.join(map(repr, clash))} has the name of a column "
            f"the late-data table keeps itself ({', '.join(kept)}): rename it in the silver "
            "schema (or a transform) before the gold table reads it"
        )
    return StructType(
        [
            *(StructField(f.name, whole[f.name]) if f.name in whole else f for f in input_schema),
            *own.fields,
            *(
                StructField(name, row_type)
                for name, row_type in whole.items()
                if name not in inputs
            ),
        ]
    )


def grown_type(existing: DataType, wanted: DataType) -> DataType | None:
    """``existing`` with the struct fields ``wanted`` has more, at any depth (its own fields first,
    in their order, as Delta's schema evolution leaves them); None when ``wanted`` is not
    ``existing`` plus fields (one of them removed or retyped)."""
    if not (isinstance(existing, StructType) and isinstance(wanted, StructType)):
        return existing if existing == wanted else None
    wanted_fields = {f.name: f for f in wanted.fields}
    kept = []
    for field in existing.fields:
        new = wanted_fields.get(field.name)
        grown = grown_type(field.dataType, new.dataType) if new is not None else None
        if grown is None:
            return None
        kept.append(StructField(field.name, grown, field.nullable, field.metadata))
    have = set(existing.fieldNames())
    return StructType([*kept, *(f for f in wanted.fields if f.name not in have)])


def late_design(
    existing: StructType, wanted: StructType, whole: Sequence[str]
) -> tuple[StructType, StructType | None]:
    """(the schema to check the late table against, the table's schema to evolve it to or None)
    for a table of schema ``existing``: ``wanted`` with each whole-row struct column ``whole`` as
    the table's grown by the fields it lacks; a struct that cannot grow into it stays as wanted,
    for the table check to refuse."""
    have = {f.name: f for f in existing.fields}
    design: list[StructField] = []
    grown: dict[str, StructField] = {}
    for field in wanted.fields:
        old = have.get(field.name)
        if field.name in whole and old is None:
            grown[field.name] = field
        elif field.name in whole and old is not None:
            row_type = grown_type(old.dataType, field.dataType)
            if row_type is not None:
                field = StructField(field.name, row_type, old.nullable, old.metadata)
                if row_type != old.dataType:
                    grown[field.name] = field
        design.append(field)
    if not grown:
        return StructType(design), None
    evolved = [grown.get(f.name, f) for f in existing.fields]
    evolved += [f for name, f in grown.items() if name not in have]
    return StructType(design), StructType(evolved)


def grow_late_table(
    spark: SparkSession, late: CatalogTable, wanted: StructType, whole: Iterable[str],
    identity: FlowIdentity | None,
) -> StructType:  # fmt: skip
    """The late table's design schema (:func:`late_design`); the table, when it is this flow's
    (``identity``'s) and of an older layout, grown to it first (module doc). A table of another
    flow is left alone (the table check refuses it)."""
    path = late.location
    properties = table_properties(spark, path)
    flow_id = identity.flow_id if identity is not None else None
    if properties is None or flow_id is None or properties.get(FLOW_ID_PROPERTY) != flow_id:
        return wanted
    existing = spark.read.format("delta").load(path).schema
    design, evolved = late_design(existing, wanted, tuple(whole))
    if evolved is not None:
        empty = spark.createDataFrame([], evolved)

        def evolve() -> None:
            empty.write.format("delta").mode("append").option("mergeSchema", "true").save(path)

        retry_on_maintenance(evolve, late.name, 0)
    return design

"""Schema changes upstream, under the spec's ``silver.schema_changes`` policy.

A producer adds a field, drops or renames one, or starts sending another type. The silver stage
compares each parsed record's top-level fields (for Debezium: those of the ``after`` image of a
create, update or snapshot read) with the declared schema, in the same projection as the parsing:

* **undeclared fields** (``new_columns``): ``evolve`` adds them as nullable columns of the silver
  tables (see below); ``rescue`` keeps them, as a JSON object with their values as sent, in the
  :data:`~pipelines.spec.RESCUED_DATA_COLUMN` column; ``quarantine`` sends the record to the
  quarantine with :data:`UNDECLARED_COLUMNS` and the names; ``ignore`` drops them (bronze keeps
  the record; with ``missing_columns: allow`` too, nothing is looked at and nothing costs);
  ``fail`` stops the flow.
* **missing columns** (``missing_columns``): a declared column absent from the record (absent,
  not null) was dropped or renamed upstream: ``quarantine`` (:data:`MISSING_COLUMNS`), ``allow``
  (null) or ``fail``.
* **type changes** (``type_changes``): a value that does not fit its declared type is found by
  the parser (:data:`SCHEMA_MISMATCH`): ``quarantine`` or ``fail``.

``fail`` is decided in the batch's one aggregation, before any write, like a ``fail``
expectation: nothing of the batch is committed, and every start replays it until the spec says
how to take the change (:class:`SchemaChangeError`).

Evolving: the aggregation also collects the batch's undeclared field names. When there are new
ones that can be column names (identifiers not starting with ``_``, not equal to an existing
column but for case), the stage infers their types from the batch (one more aggregation, Spark's
``schema_of_variant_agg`` over the values: integers BIGINT, other numbers DOUBLE, booleans
BOOLEAN, anything else STRING holding the value's JSON), records them in the events table's
:data:`EVOLVED_COLUMNS_PROPERTY` (before altering anything: a crash in between is finished by the
next start), adds them to every silver table that keeps all columns (``ALTER TABLE ADD COLUMNS``)
and parses the batch again. Earlier rows read null in them. The next start reads the property
back, so the stage keeps parsing them; declaring one in the spec later, with the same type, makes
it an ordinary column (another type is refused at start, naming the column; for a history table
that tracks all columns, declaring it makes it tracked, which needs a full refresh). History keeps
evolved columns, and ``_rescued_data``, untracked. A full refresh re-reads bronze from its start:
records from before a column existed upstream lack it, so with ``missing_columns: quarantine``
(Debezium's default) declare new columns only with ``missing_columns: allow``, or accept those
records in the quarantine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType

from pipelines.catalog.lifecycle import ddl_struct, sql_properties
from pipelines.delta_writes import table_properties
from pipelines.silver.expectations import SAMPLE_CHARS
from pipelines.silver.parse import REASONS, SCHEMA_MISMATCH, parsed_event
from pipelines.spec import IDENTIFIER_RE, RESCUED_DATA_COLUMN, SilverSpec, ddl_fields

__all__ = ["SCHEMA_MISMATCH"]  # the parser's reason for a value of another type than declared
#: How a quarantine reason for declared columns absent from the record starts.
MISSING_COLUMNS = "declared columns missing from the record (dropped or renamed upstream?): "
#: How a quarantine reason for undeclared fields (``new_columns: quarantine`` or ``fail``) starts.
UNDECLARED_COLUMNS = "undeclared columns (schema_changes.new_columns): "
#: Parse-time column: the record's undeclared top-level fields (empty when not looked at).
UNDECLARED = "_undeclared_columns"
#: Events-table property: the columns evolved into the silver tables, as DDL.
EVOLVED_COLUMNS_PROPERTY = "conflux.silver.evolvedColumns"
_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")


class SchemaChangeError(RuntimeError):
    """Records of a batch changed schema in a way the spec says ``fail`` to; nothing written."""


def _looks(spec: SilverSpec) -> bool:
    """Whether the policy needs each record's field names (``ignore`` + ``allow``: no cost)."""
    policy = spec.schema_changes
    return policy.new_columns != "ignore" or spec.missing_columns != "allow"


def record_text(spec: SilverSpec, value_text: Column) -> Column:
    """The JSON object whose fields are the row: the value (json) or the ``after`` image of a
    Debezium change, bare or under ``payload`` (null for a delete, which has none)."""
    if spec.format == "json":
        return value_text
    return F.coalesce(
        F.get_json_object(value_text, "$.payload.after"), F.get_json_object(value_text, "$.after")
    )


def _names(names: Iterable[str]) -> Column:
    return F.array(*(F.lit(name) for name in names))


def with_record_fields(
    frame: DataFrame, spec: SilverSpec, required: Sequence[str] | None = None
) -> DataFrame:
    """``frame`` (the output of :func:`~pipelines.silver.parse.parse_batch`) with
    :data:`UNDECLARED`, the policy's reasons added to its reasons, and the rescued fields when
    the spec rescues them.

    ``required``: the columns a record must carry under ``missing_columns`` (default: the
    declared ones); evolved columns are not required, since records before them lack them.

    Only rows that parsed so far are looked at (a record that did not parse has no fields to
    compare), with one ``json_object_keys`` over the record's text.
    """
    empty = F.array().cast("array<string>")
    if not _looks(spec):
        frame = frame.withColumn(UNDECLARED, empty)
    else:
        text = record_text(spec, F.col("raw_value").cast("string"))
        keys = F.when(parsed_event(), F.json_object_keys(text))
        declared = _names(spec.declared_columns())
        frame = frame.withColumn("_record_keys", keys).withColumn(
            UNDECLARED,
            F.coalesce(
                F.filter(F.col("_record_keys"), lambda k: ~F.array_contains(declared, k)), empty
            ),
        )
        reasons: list[Column] = []
        if spec.missing_columns != "allow":
            must = _names(spec.declared_columns() if required is None else required)
            missing = F.filter(must, lambda c: ~F.array_contains(F.col("_record_keys"), c))
            reasons.append(
                F.when(
                    F.col("_record_keys").isNotNull() & (F.size(missing) > 0),
                    F.concat(F.lit(MISSING_COLUMNS), F.array_join(missing, ", ")),
                )
            )
        if spec.schema_changes.new_columns in ("quarantine", "fail"):
            reasons.append(
                F.when(
                    F.size(F.col(UNDECLARED)) > 0,
                    F.concat(F.lit(UNDECLARED_COLUMNS), F.array_join(F.col(UNDECLARED), ", ")),
                )
            )
        if reasons:
            found = F.filter(F.array(*reasons), lambda r: r.isNotNull())
            frame = frame.withColumn(REASONS, F.concat(F.col(REASONS), found))
        if spec.schema_changes.new_columns == "rescue":
            fields = F.from_json(text, "map<string,variant>")
            rescued = F.to_json(F.map_filter(fields, lambda k, _: ~F.array_contains(declared, k)))
            frame = frame.withColumn(
                RESCUED_DATA_COLUMN, F.when(F.size(F.col(UNDECLARED)) > 0, rescued)
            )
        frame = frame.drop("_record_keys")
    return frame


def failing_prefixes(spec: SilverSpec) -> tuple[str, ...]:
    """The reason prefixes whose rows stop the flow under the spec's policy."""
    policy = spec.schema_changes
    prefixes = []
    if policy.type_changes == "fail":
        prefixes.append(SCHEMA_MISMATCH)
    if spec.missing_columns == "fail":
        prefixes.append(MISSING_COLUMNS)
    if policy.new_columns == "fail":
        prefixes.append(UNDECLARED_COLUMNS)
    return tuple(prefixes)


def _has_reason(prefixes: Iterable[str]) -> Column:
    wanted = tuple(prefixes)
    return F.exists(
        F.col(REASONS),
        lambda reason: F.greatest(*(reason.startswith(p) for p in wanted), F.lit(False)),
    )


def aggregates(spec: SilverSpec) -> list[Column]:
    """Aggregate columns of the batch's one pass: ``schema_mismatches`` (records quarantined for
    a schema change), ``rescued``, ``undeclared_columns`` (names in the events, under
    ``evolve``), and
    ``schema_failed`` / ``schema_sample`` (a row stopping the flow, as JSON)."""
    columns = [
        F.count_if(_has_reason((SCHEMA_MISMATCH, MISSING_COLUMNS, UNDECLARED_COLUMNS))).alias(
            "schema_mismatches"
        ),
        (
            F.count_if(F.col(RESCUED_DATA_COLUMN).isNotNull())
            if spec.schema_changes.new_columns == "rescue"
            else F.lit(0)
        ).alias("rescued"),
    ]
    if spec.schema_changes.new_columns == "evolve":
        columns.append(
            F.array_sort(
                F.array_distinct(
                    F.flatten(F.collect_set(F.when(parsed_event(), F.col(UNDECLARED))))
                )
            ).alias("undeclared_columns")
        )
    prefixes = failing_prefixes(spec)
    if prefixes:
        failing = _has_reason(prefixes)
        sample = F.substring(
            F.to_json(F.struct("_source_partition", "_source_offset", F.col(REASONS))),
            1,
            SAMPLE_CHARS,
        )
        columns += [
            F.count_if(failing).alias("schema_failed"),
            F.first(F.when(failing, sample), ignorenulls=True).alias("schema_sample"),
        ]
    return columns


def failure_message(
    flow: str, spec_file: str, batch_id: int, failed: int, sample: str | None, spec: SilverSpec
) -> str:
    """Why a batch stopped the flow, a failing record, and the ways forward."""
    policy = spec.schema_changes
    fields = [
        f"{name}: fail"
        for name, value in (
            ("type_changes", policy.type_changes),
            ("missing_columns", spec.missing_columns),
            ("new_columns", policy.new_columns),
        )
        if value == "fail"
    ]
    return (
        f"flow {flow}: silver batch {batch_id}: {failed} record(s) changed schema and "
        f"silver.schema_changes says {', '.join(fields)}; a record (partition, offset, reasons): "
        f"{sample or '?'}. Nothing of the batch was written, and every start replays it. To get "
        f"past it, change {spec_file}: declare the change in silver.schema (a new column; a new "
        "type needs `conflux refresh` of the silver tables), or set the policy to quarantine "
        "(the records go to the quarantine with the change named) or, for new columns, evolve. "
        "[schema change]"
    )


def addable_columns(names: Sequence[str], existing: Iterable[str]) -> tuple[list[str], list[str]]:
    """(names that can become columns, names that cannot) of undeclared fields.

    A column name must be an identifier not starting with ``_`` (silver's metadata) and differ
    from every existing column also when case is ignored (Delta resolves names without case).
    """
    taken = {name.lower() for name in existing}
    addable, skipped = [], []
    for name in names:
        if IDENTIFIER_RE.match(name) and not name.startswith("_") and name.lower() not in taken:
            addable.append(name)
            taken.add(name.lower())
        else:
            skipped.append(name)
    return addable, skipped


def column_type(inferred: str) -> str:
    """The column type for a field whose values ``schema_of_variant_agg`` typed as ``inferred``.

    Integers become BIGINT, other numbers DOUBLE, booleans BOOLEAN; strings, nulls only, objects,
    arrays and mixed types become STRING (a non-string value is kept as its JSON text), so that a
    later record of the same field rarely fails to parse.
    """
    kind = inferred.strip().upper()
    if kind in ("BIGINT", "INT", "SMALLINT", "TINYINT"):
        return "BIGINT"
    if kind in ("DOUBLE", "FLOAT"):
        return "DOUBLE"
    if kind == "BOOLEAN":
        return "BOOLEAN"
    decimal = _DECIMAL.match(kind)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return "BIGINT" if scale == 0 and precision <= 18 else "DOUBLE"
    return "STRING"


def inferred_columns(parsed: DataFrame, spec: SilverSpec, names: Sequence[str]) -> StructType:
    """The types of the undeclared fields ``names`` over the batch's events that carry them (a
    quarantined record, e.g. one whose column was renamed, evolves nothing)."""
    record = F.try_parse_json(record_text(spec, F.col("raw_value").cast("string")))
    row = (
        parsed.where(parsed_event() & (F.size(F.col(UNDECLARED)) > 0))
        .agg(
            *(
                F.schema_of_variant_agg(F.try_variant_get(record, f"$.{name}", "variant")).alias(
                    name
                )
                for name in names
            )
        )
        .first()
    )
    assert row is not None
    return StructType(
        [StructField(name, _ddl_type(column_type(str(row[name] or "VOID")))) for name in names]
    )


def _ddl_type(kind: str) -> DataType:
    return ddl_struct(f"c {kind}")["c"].dataType


def as_ddl(fields: Iterable[StructField]) -> str:
    """``\\`a\\` BIGINT, \\`b\\` STRING``: columns as a DDL string."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString().upper()}" for f in fields)


def widened(spec: SilverSpec, ddl: str) -> SilverSpec:
    """``spec`` whose schema also holds the columns of ``ddl`` it does not declare itself."""
    declared = {name.lower() for name in spec.declared_columns()}
    extra = [(n, kind) for n, kind in ddl_fields(ddl) if n.lower() not in declared]
    if not extra:
        return spec
    columns = ", ".join(f"`{name}` {kind}" for name, kind in extra)
    return spec.model_copy(update={"schema_ddl": f"{spec.schema_ddl}, {columns}"})


def evolved_ddl(spec: SilverSpec, spec_columns: Sequence[str]) -> str:
    """The columns of ``spec``'s schema that ``spec_columns`` (the spec as written) does not
    declare: those evolved into it, as DDL."""
    return ", ".join(
        f"`{name}` {kind}" for name, kind in ddl_fields(spec.schema_ddl) if name not in spec_columns
    )


def evolved_columns(spark: SparkSession, events_path: str) -> str:
    """The columns evolved into the flow's silver tables so far (DDL; empty when none)."""
    return (table_properties(spark, events_path) or {}).get(EVOLVED_COLUMNS_PROPERTY, "")


def record_evolved(spark: SparkSession, events_path: str, ddl: str) -> None:
    """Store ``ddl`` as the evolved columns, in the events table's properties."""
    assignments = sql_properties({EVOLVED_COLUMNS_PROPERTY: ddl})
    spark.sql(f"ALTER TABLE delta.`{events_path}` SET TBLPROPERTIES ({assignments})")

"""What the silver stage's tables must look like: designed at start from the spec and from the
parser's (and the transform's) output schema on an empty batch, which also proves that every
expression of the spec analyses (see :mod:`pipelines.stages.silver`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pipelines.catalog.lifecycle import TableDesign, ddl_struct
from pipelines.catalog.roles import TableRole
from pipelines.errors import ConfigError
from pipelines.silver import current as current_state
from pipelines.silver import history as history_state
from pipelines.silver.bound_plan import varies_by_run
from pipelines.silver.expectations import passes, with_expectations
from pipelines.silver.parse import EVENT_METADATA, events_of
from pipelines.silver.tables import (
    CHAINING_PROPERTY,
    FORMAT_PROPERTY,
    HISTORY_PROPERTY,
    KEYS_PROPERTY,
    SEQUENCE_PROPERTY,
)
from pipelines.silver.transform import (
    Transform,
    apply_transform,
    checked_row_schema,
    load_transform,
)
from pipelines.spec import RESCUED_DATA_COLUMN, FlowSpec, SilverSpec

_EVENT_METADATA_TYPES = {
    "_op": "string",
    "_event_time": "timestamp",
    "_event_date": "date",
    "_source_topic": "string",
    "_source_partition": "int",
    "_source_offset": "long",
    "_source_timestamp": "timestamp",
    "_source_ts_ms": "long",
    "_source_lsn": "long",
    "_ingested_at": "timestamp",
    "_batch_id": "long",
}
QUARANTINE_DDL = (
    "flow STRING, batch_id BIGINT, topic STRING, partition INT, offset BIGINT, "
    "kafka_timestamp TIMESTAMP, raw_key BINARY, raw_value BINARY, reasons ARRAY<STRING>, "
    "quarantined_at TIMESTAMP"
)


class SilverDesign:
    """The silver stage's table designs and start-time analysis (mixed into
    :class:`pipelines.stages.silver.SilverStage`, which owns the state named here)."""

    spec: FlowSpec
    silver: SilverSpec
    transform: Transform | None
    row_columns: tuple[str, ...]
    spec_columns: tuple[str, ...]

    def _design(self, role: TableRole, schema: StructType, **more: Any) -> TableDesign:
        raise NotImplementedError

    def _parse(self, bronze_rows: DataFrame, batch_id: int, judged: bool = True) -> DataFrame:
        raise NotImplementedError

    def _count(self, parsed: DataFrame) -> dict[str, Any]:
        raise NotImplementedError

    def designs(self, spark: SparkSession) -> list[TableDesign]:
        """What each silver table must look like, from the spec and the parser's (and the
        transform's) output schema."""
        silver = self.silver
        row, metadata, sequence_type = self._analyse(spark)
        self.row_columns = tuple(row.fieldNames())
        # Chaining decides whose batch ids the writes carry: switching would skip or redo batches.
        spec_properties = {FORMAT_PROPERTY: silver.format, CHAINING_PROPERTY: silver.chaining}
        designs = [
            self._design(
                TableRole.EVENTS,
                schema=StructType([*row.fields, *metadata.fields]),
                partition_by=("_event_date",),
                spec_properties=spec_properties,
                delta_properties=silver.events.delta_properties(),
                stated_properties=silver.events.stated_properties(),
                spec_field="silver.events",
            ),
            self._design(
                TableRole.QUARANTINE,
                schema=ddl_struct(QUARANTINE_DDL),
                delta_properties=silver.quarantine.delta_properties(),
                stated_properties=silver.quarantine.stated_properties(),
                spec_field="silver.quarantine",
            ),
        ]
        current = silver.current
        if current is not None:
            keyed = {
                **spec_properties,
                KEYS_PROPERTY: ",".join(current.keys),
                SEQUENCE_PROPERTY: silver.sequence_expression,
            }
            keys = [row[k] for k in current.keys]
            values = [row[c] for c in current_state.value_columns(silver, self.row_columns)]
            designs += [
                self._design(
                    TableRole.CURRENT,
                    schema=StructType(
                        [
                            *keys,
                            *values,
                            *ddl_struct(
                                f"_sequence {sequence_type}, _op STRING, "
                                "_event_time TIMESTAMP, _updated_at TIMESTAMP"
                            ).fields,
                        ]
                    ),
                    partition_by=current.partition_by,
                    cluster_by=current.cluster_by,
                    spec_properties=keyed,
                    delta_properties=current.delta_properties(
                        change_data_feed=True, deletion_vectors=True
                    ),
                    stated_properties=current.stated_properties(),
                    spec_field="silver.current",
                ),
                self._design(
                    TableRole.DELETED_KEYS,
                    schema=StructType(
                        [
                            *keys,
                            *ddl_struct(f"_sequence {sequence_type}, _deleted_at TIMESTAMP").fields,
                        ]
                    ),
                    spec_properties=keyed,
                    delta_properties={
                        "delta.enableDeletionVectors": current.delta_properties(
                            deletion_vectors=True
                        )["delta.enableDeletionVectors"]
                    },
                    spec_field="silver.current",
                ),
            ]
        if silver.history is not None:
            designs.append(self._history_design(row, sequence_type, spec_properties))
        return designs

    def _history_design(
        self, row: StructType, sequence_type: str, spec_properties: Mapping[str, str]
    ) -> TableDesign:
        history = self.silver.history
        assert history is not None
        plan = self._history_plan()
        return self._design(
            TableRole.HISTORY,
            schema=StructType(
                [
                    *(row[c] for c in (*plan.keys, *plan.values)),
                    *ddl_struct(
                        f"_valid_from {sequence_type}, _valid_to {sequence_type}, "
                        "_valid_from_time TIMESTAMP, _valid_to_time TIMESTAMP, "
                        "_is_current BOOLEAN, _updated_at TIMESTAMP"
                    ).fields,
                ]
            ),
            cluster_by=history.cluster_by,
            spec_properties={
                **spec_properties,
                KEYS_PROPERTY: ",".join(plan.keys),
                SEQUENCE_PROPERTY: self.silver.sequence_expression,
                HISTORY_PROPERTY: ",".join(plan.tracked)
                + (";ignoreNullUpdates" if plan.ignore_null_updates else ""),
            },
            delta_properties=history.delta_properties(change_data_feed=True, deletion_vectors=True),
            stated_properties=history.stated_properties(),
            spec_field="silver.history",
        )

    def _evolved(self) -> list[str]:
        """The columns evolved into the tables (parsed, but not declared by the spec)."""
        return [c for c in self.silver.declared_columns() if c not in self.spec_columns]

    def _history_plan(self) -> history_state.HistoryPlan:
        """Evolved columns and rescued fields are kept, not tracked: what arrives undeclared does
        not change what a version is."""
        untracked = [*self._evolved(), RESCUED_DATA_COLUMN]
        return history_state.HistoryPlan.of(self.silver, self.row_columns, untracked)

    def _analyse(self, spark: SparkSession) -> tuple[StructType, StructType, str]:
        """(row columns, metadata columns, sequence type) of the events a batch writes: the
        parser's output on an empty batch, through the transform when the spec has one."""
        silver = self.silver
        empty = spark.createDataFrame(
            [],
            ddl_struct(
                "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
                "kafka_timestamp TIMESTAMP, ingested_at TIMESTAMP"
            ),
        )
        try:
            parsed = self._parse(empty, 0, judged=False)
            events = events_of(parsed, silver)
        except Exception as exc:  # an AnalysisException names the unknown column or bad syntax
            raise ConfigError(
                f"{self.spec.spec_file}: silver: the spec's expressions do not analyse against "
                f"the parsed row ({', '.join(silver.columns())} and {', '.join(EVENT_METADATA)}): "
                f"{str(exc).splitlines()[0]}"
            ) from exc
        self._check_expectations(parsed)
        sequence_type = events.schema["_sequence"].dataType.simpleString()
        metadata = ddl_struct(
            ", ".join(
                f"{name} {_EVENT_METADATA_TYPES.get(name, sequence_type)}"
                for name in EVENT_METADATA
            )
        )
        row = ddl_struct(silver.schema_ddl)
        if RESCUED_DATA_COLUMN in silver.columns():
            row = row.add(RESCUED_DATA_COLUMN, "string")
        if silver.transform is None:
            return row, metadata, sequence_type
        if self.transform is None:
            self.transform = load_transform(silver.transform, self.spec.spec_file, spark)
        output = apply_transform(
            self.transform, silver.transform, events, self.spec.name, "check at start"
        )
        row = checked_row_schema(
            output.schema,
            events.schema,
            EVENT_METADATA,
            self._required_columns(),
            f"{self.spec.spec_file}: silver.transform {silver.transform}",
        )
        # Table columns stay nullable whatever the transform's plan says (no NOT NULL constraints).
        return (
            StructType([StructField(f.name, f.dataType) for f in row.fields]),
            metadata,
            sequence_type,
        )

    def _check_expectations(self, parsed: DataFrame) -> None:
        """Every expectation analyses against the parsed row, is a deterministic condition of one
        row (no aggregate, window, randomness or clock: a replayed batch must be judged alike),
        and the batch's whole evaluation runs (on no rows) without error."""
        expectations = self.silver.expectations
        if not expectations:
            return
        for index, expectation in enumerate(expectations):
            where = (
                f"{self.spec.spec_file}: silver.expectations.{index} ({expectation.name}: "
                f"{expectation.describe()})"
            )
            condition = F.expr(expectation.expr) if expectation.expr else passes(expectation)
            try:
                projected = parsed.select(condition)
                kind = projected.schema[0].dataType.simpleString()
                expression = projected._jdf.queryExecution().analyzed().expressions().head()
                deterministic = not varies_by_run(expression)
                refs = expression.references().toSeq()
                names = {refs.apply(i).name() for i in range(refs.size())}
                if expectation.rule == "matches":  # compile the pattern as Spark (Java) does
                    parsed.sparkSession.range(1).select(
                        F.lit("").rlike(f"^(?:{expectation.args['pattern']})$")
                    ).collect()
            except Exception as exc:  # an AnalysisException names the unknown column
                raise ConfigError(
                    f"{where}: does not analyse against the parsed row "
                    f"({', '.join((*self.silver.columns(), *EVENT_METADATA))}): "
                    f"{str(exc).splitlines()[0]}"
                ) from exc
            if kind != "boolean":
                raise ConfigError(
                    f"{where}: is {kind}, not a condition; write one such as `amount >= 0`"
                )
            if not deterministic:
                raise ConfigError(
                    f"{where}: is not deterministic (randomness or the current time): a batch "
                    "replayed after a crash would be judged differently; compare with a column "
                    "such as _ingested_at instead"
                )
            if "_batch_id" in names:
                raise ConfigError(
                    f"{where}: names _batch_id, which is stamped on a row after it is judged (the "
                    "judging is planned once for every batch); judge the row's own columns"
                )
        try:
            self._count(with_expectations(parsed, expectations))
        except Exception as exc:  # an aggregate or window inside an expression, a bad literal
            raise ConfigError(
                f"{self.spec.spec_file}: silver.expectations: they cannot be evaluated row by "
                f"row (no aggregates or window functions): {str(exc).splitlines()[0]}"
            ) from exc

    def _required_columns(self) -> list[tuple[str, str]]:
        """(column, spec field) of every column a table of the spec names."""
        silver, required = self.silver, []
        if silver.current is not None:
            for field in ("keys", "columns", "partition_by"):
                required += [(c, f"silver.current.{field}") for c in getattr(silver.current, field)]
        if silver.history is not None:
            required += [(c, "silver.history.keys") for c in silver.history_keys]
            required += [(c, "silver.history.track_history") for c in silver.history.track_history]
        if silver.event_time is not None:
            required.append((silver.event_time, "silver.event_time"))
        return required

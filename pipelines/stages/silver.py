"""Silver stage: parse bronze rows into an events table, a current-state table and a quarantine.

One micro-batch of bronze rows is parsed once (:func:`pipelines.silver.parse.parse_batch`) and
persisted, then written, each write idempotent under the batch id with an app id of its own
table (``conflux-<flow id>-g<generation>-<table>``; see :mod:`pipelines.delta_writes`):

1. the events that parsed to the append-only **events table**, partitioned by ``_event_date``:
   downstream streams and date-range backfills read it (a Delta stream cannot follow a table that
   MERGE rewrites);
2. the records that did not to the **quarantine table**, with their bytes and reasons;
3. when the spec declares ``current``, the batch reduced to one row per key, MERGEd into the
   **current-state table**, and its deletes into the deleted-keys side table
   (:mod:`pipelines.silver.current`);
4. when the spec declares ``history``, the versions of the batch's keys, recomputed from the
   events table, MERGEd into the **history table** (:mod:`pipelines.silver.history`).

A spec's ``transform`` (:mod:`pipelines.silver.transform`) rewrites the parsed events before any
of these writes; the tables are designed from its output schema.

Empty writes are skipped (one aggregation over the persisted batch counts the three kinds of rows
first). The stage runs either as its own query reading the bronze table as a Delta stream, with its
own checkpoint (``chaining: stream``), or inside the bronze query's ``foreachBatch`` on the rows
bronze just wrote (``chaining: bronze_batch``); the batch id, and so the idempotence, is that of
the query it runs in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from pipelines.delta_writes import (
    TableWrite,
    append_idempotently,
    committed_write,
    idempotent_session,
    retry_on_maintenance,
)
from pipelines.errors import ConfigError
from pipelines.identity import (
    FlowIdentity,
    checkpoint_has_commits,
    checkpoint_has_offsets,
    read_identity,
)
from pipelines.lease import LeaseGuard
from pipelines.locations import FlowLocations, deleted_keys_path, table_paths
from pipelines.progress import BatchCommit, delta_version
from pipelines.settings import Settings
from pipelines.silver import current as current_state
from pipelines.silver import history as history_state
from pipelines.silver.expectations import (
    ExpectationFailedError,
    batch_aggregates,
    batch_quality,
    failure_message,
    failures,
    passes,
    with_expectations,
)
from pipelines.silver.parse import (
    EVENT_METADATA,
    PARSER_COLUMNS,
    bronze_rows_of,
    ddl_struct,
    events_of,
    parse_batch,
    quarantine_of,
)
from pipelines.silver.refresh import (
    SilverRefresh,
    begin_refresh,
    complete_refresh,
    refresh_checkpoint,
    refuse_pending,
)
from pipelines.silver.schema_changes import (
    SchemaChangeError,
    addable_columns,
    as_ddl,
    evolved_columns,
    evolved_ddl,
    inferred_columns,
    record_evolved,
    widened,
    with_record_fields,
)
from pipelines.silver.schema_changes import aggregates as schema_aggregates
from pipelines.silver.schema_changes import failure_message as schema_failure_message
from pipelines.silver.tables import (
    CHAINING_PROPERTY,
    FORMAT_PROPERTY,
    HISTORY_PROPERTY,
    KEYS_PROPERTY,
    SEQUENCE_PROPERTY,
    TableDesign,
    ensure_table,
)
from pipelines.silver.transform import (
    Transform,
    apply_transform,
    checked_row_schema,
    load_transform,
    materialize,
)
from pipelines.spec import RESCUED_DATA_COLUMN, FlowSpec, SilverSpec

STAGE = "silver"
log = logging.getLogger(__name__)
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


class SilverStage:
    """One flow's silver stage (see the module doc)."""

    kind = STAGE
    output_mode = "append"

    reads_flows: tuple[str, ...] = ()

    def __init__(
        self,
        spec: FlowSpec,
        settings: Settings,
        guard: LeaseGuard | None,
        on_commit: Callable[[BatchCommit], None],
        full_refresh: bool = False,
    ) -> None:
        """``full_refresh``: this run rebuilds the silver tables beside the live ones
        (:mod:`pipelines.silver.refresh`); without it, a pending refresh is refused."""
        assert spec.silver is not None
        self.spec = spec
        self.silver: SilverSpec = spec.silver
        self.locations = FlowLocations.of(spec, settings)
        self.settings = settings
        self.guard = guard
        self.on_commit = on_commit
        self.query_name = f"{spec.name}.{STAGE}"
        self.own_query = self.silver.chaining == "stream"
        if full_refresh:
            self.refresh: SilverRefresh | None = begin_refresh(spec, settings)
        else:
            refuse_pending(spec, settings)
            self.refresh = None
        self.checkpoint: Path = (
            self.locations.stage_checkpoint(STAGE) if self.own_query else self.locations.checkpoint
        )
        if self.refresh is not None:
            self.checkpoint = refresh_checkpoint(self.locations)
        paths = {
            role: self._located(str(path))
            for role, path in table_paths(spec, settings).items()
            if role != "bronze"
        }
        self.events_path = paths["events"]
        self.quarantine_path = paths["quarantine"]
        current = self.silver.current
        self.current_path = paths["current"] if current else None
        self.deleted_path = (
            self._located(str(deleted_keys_path(table_paths(spec, settings)["current"])))
            if current
            else None
        )
        self.tables = {
            "events": (self.silver.events.table, self.events_path),
            "quarantine": (self.silver.quarantine.table, self.quarantine_path),
        }
        if current is not None and self.current_path is not None:
            self.tables["current"] = (current.table, self.current_path)
        history = self.silver.history
        self.history_path = paths["history"] if history else None
        if history is not None and self.history_path is not None:
            self.tables["history"] = (history.table, self.history_path)
        self.main_table = self.current_path or self.history_path or self.events_path
        self.identity: FlowIdentity | None = None
        self.transform: Transform | None = None
        #: The parsed (and transformed) row's columns, without the metadata: set by designs().
        self.row_columns: tuple[str, ...] = self.silver.columns()
        #: The schema's columns as the spec declares them (not those evolved since).
        self.spec_columns = self.silver.declared_columns()
        #: Undeclared fields already logged as impossible column names.
        self.skipped_fields: set[str] = set()

    def _located(self, live_path: str) -> str:
        """Where this run writes the table at ``live_path``: beside it during a full refresh."""
        return SilverRefresh.beside(live_path) if self.refresh is not None else live_path

    def app_id(self, table: str) -> str:
        assert self.identity is not None, "prepare() runs before any batch"
        generation = self.refresh.generation if self.refresh is not None else None
        return self.identity.silver_app_id(table, generation)

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        """After a clean end of the run: swap a full refresh's rebuilt tables in."""
        if self.refresh is None:
            return []
        return complete_refresh(spark, self.spec, self.settings)

    # -- start -------------------------------------------------------------------------------

    def designs(self, spark: SparkSession) -> list[TableDesign]:
        """What each silver table must look like, from the spec and the parser's (and the
        transform's) output schema."""
        silver = self.silver
        row, metadata, sequence_type = self._analyse(spark)
        self.row_columns = tuple(row.fieldNames())
        # Chaining decides whose batch ids the writes carry: switching would skip or redo batches.
        spec_properties = {FORMAT_PROPERTY: silver.format, CHAINING_PROPERTY: silver.chaining}
        designs = [
            TableDesign(
                role="events",
                table=silver.events.table,
                path=self.events_path,
                schema=StructType([*row.fields, *metadata.fields]),
                partition_by=("_event_date",),
                spec_properties=spec_properties,
                delta_properties=silver.events.delta_properties(),
                stated_properties=silver.events.stated_properties(),
                spec_field="silver.events",
            ),
            TableDesign(
                role="quarantine",
                table=silver.quarantine.table,
                path=self.quarantine_path,
                schema=ddl_struct(QUARANTINE_DDL),
                delta_properties=silver.quarantine.delta_properties(),
                stated_properties=silver.quarantine.stated_properties(),
                spec_field="silver.quarantine",
            ),
        ]
        current = silver.current
        if current is not None:
            assert self.current_path is not None and self.deleted_path is not None
            keyed = {
                **spec_properties,
                KEYS_PROPERTY: ",".join(current.keys),
                SEQUENCE_PROPERTY: silver.sequence_expression,
            }
            keys = [row[k] for k in current.keys]
            values = [row[c] for c in current_state.value_columns(silver, self.row_columns)]
            designs += [
                TableDesign(
                    role="current",
                    table=current.table,
                    path=self.current_path,
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
                TableDesign(
                    role="deleted_keys",
                    table=f"{current.table}__deleted_keys",
                    path=self.deleted_path,
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
        assert history is not None and self.history_path is not None
        plan = self._history_plan()
        return TableDesign(
            role="history",
            table=history.table,
            path=self.history_path,
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
                analyzed = projected._jdf.queryExecution().analyzed()
                deterministic = bool(analyzed.expressions().head().deterministic())
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

    def prepare(self, spark: SparkSession) -> None:
        """Check the silver tables against the spec and the checkpoint; create what is missing.

        Runs after the bronze stage prepared (the flow's identity exists by then).

        Raises:
            IdentityError / ConfigError: the tables cannot be continued under this spec.
        """
        identity = read_identity(self.locations)
        assert identity is not None, "the bronze stage writes the flow's identity first"
        self.identity = identity
        # Columns evolved by earlier runs are parsed as if declared (and kept in every table).
        self.silver = widened(self.silver, evolved_columns(spark, self.events_path))
        committed = checkpoint_has_commits(self.checkpoint)
        started = checkpoint_has_offsets(self.checkpoint)
        for design in self.designs(spark):
            ensure_table(spark, design, identity, committed, self.spec.spec_file, started)

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """The bronze table as a Delta stream: what the stage's own query reads."""
        reader = spark.readStream.format("delta")
        if self.silver.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", str(self.silver.max_files_per_trigger))
        return reader.load(str(self.locations.table))

    # -- every batch -------------------------------------------------------------------------

    def _parse(self, bronze_rows: DataFrame, batch_id: int, judged: bool = True) -> DataFrame:
        """Parse a batch: rows, their schema changes (policy reasons, rescued fields) and (when
        ``judged``) their expectations, in one projection."""
        parsed = parse_batch(bronze_rows, self.silver, batch_id)
        parsed = with_record_fields(parsed, self.silver, self.spec_columns)
        return with_expectations(parsed, self.silver.expectations) if judged else parsed

    def _count(self, parsed: DataFrame) -> dict[str, Any]:
        """The batch's one aggregation (see :func:`batch_aggregates` and
        :func:`pipelines.silver.schema_changes.aggregates`)."""
        counts = parsed.agg(
            *batch_aggregates(self.silver.expectations, self.silver.columns()),
            *schema_aggregates(self.silver),
        ).first()
        assert counts is not None
        return counts.asDict()

    def _raise_failures(self, counts: dict[str, Any], batch_id: int) -> None:
        """Stop the flow, before anything of the batch is written, when a ``fail`` expectation or
        a ``fail`` schema-change policy failed on its rows."""
        failed = failures(counts, self.silver.expectations)
        if failed:
            raise ExpectationFailedError(
                failure_message(self.spec.name, self.spec.spec_file, batch_id, failed)
            )
        if counts.get("schema_failed"):
            raise SchemaChangeError(
                schema_failure_message(
                    self.spec.name,
                    self.spec.spec_file,
                    batch_id,
                    int(counts["schema_failed"]),
                    counts["schema_sample"],
                    self.silver,
                )
            )

    def _evolve(self, parsed: DataFrame, names: list[str], batch_id: int) -> list[str]:
        """Add the batch's new undeclared fields as columns of the silver tables (see
        :mod:`pipelines.silver.schema_changes`); the columns added, as ``name TYPE``."""
        existing = (*self.silver.columns(), *self.row_columns, *EVENT_METADATA, *PARSER_COLUMNS)
        addable, skipped = addable_columns(names, existing)
        if skipped and not set(skipped) <= self.skipped_fields:
            self.skipped_fields |= set(skipped)
            log.warning(
                "flow %s: silver batch %d: undeclared fields %s cannot be column names "
                "(identifiers not starting with _, unlike existing columns): not evolved; bronze "
                "keeps the records",
                self.spec.name,
                batch_id,
                ", ".join(sorted(skipped)),
            )
        if not addable:
            return []
        evolved_so_far = self._evolved()
        limit = self.silver.schema_changes.max_new_columns
        if len(evolved_so_far) + len(addable) > limit:
            raise SchemaChangeError(
                f"flow {self.spec.name}: silver batch {batch_id}: {len(addable)} new field(s) "
                f"({', '.join(addable[:10])}{', ...' if len(addable) > 10 else ''}) would make "
                f"{len(evolved_so_far) + len(addable)} evolved columns, more than "
                f"silver.schema_changes.max_new_columns ({limit}) in {self.spec.spec_file}. Field "
                "names that keep changing are data, not columns: set new_columns to rescue (kept "
                "as JSON in _rescued_data) or ignore, or raise the limit. Nothing of the batch was "
                "written. [schema change]"
            )
        spark = parsed.sparkSession
        added = inferred_columns(parsed, self.silver, addable)
        before = self.silver
        self.silver = widened(before, as_ddl(added))
        try:  # the widened row through the parser, expectations and transform, first
            designs = self.designs(spark)
        except Exception:
            self.silver = before
            raise
        # Recorded before any table changes: a crash in between is completed by the next start.
        record_evolved(spark, self.events_path, evolved_ddl(self.silver, self.spec_columns))
        assert self.identity is not None
        for design in designs:
            ensure_table(spark, design, self.identity, True, self.spec.spec_file, True)
        columns = [f"{f.name} {f.dataType.simpleString().upper()}" for f in added]
        log.warning(
            "flow %s: silver batch %d: new columns evolved into the silver tables: %s",
            self.spec.name,
            batch_id,
            ", ".join(columns),
        )
        return columns

    def write_batch(self, bronze_rows: DataFrame, batch_id: int) -> BatchCommit:
        """Parse and write one batch of bronze rows; every write idempotent under ``batch_id``."""
        if self.guard is not None and self.own_query:
            self.guard.check()  # LeaseLostError fails the query before anything is written
        parsed = self._parse(bronze_rows, batch_id).persist()
        transformed: DataFrame | None = None
        columns_added: list[str] = []
        try:
            counts = self._count(parsed)
            self._raise_failures(counts, batch_id)  # before any write, evolving included
            undeclared = list(counts.get("undeclared_columns") or [])
            if undeclared:
                columns_added = self._evolve(parsed, undeclared, batch_id)
                if columns_added:  # parse the batch again, with the new columns
                    reparsed = self._parse(bronze_rows_of(parsed), batch_id).persist()
                    counts = self._count(reparsed)  # fills its cache from the cached batch
                    parsed.unpersist()
                    parsed = reparsed
            silver = self.silver
            expectations = silver.expectations
            events, event_count = events_of(parsed, silver), int(counts["events"])
            has_deletes = counts["deletes"] > 0
            if self.transform is not None and silver.transform is not None and event_count:
                transformed, event_count = materialize(
                    apply_transform(
                        self.transform,
                        silver.transform,
                        events,
                        self.spec.name,
                        batch_id,
                        columns=(*self.row_columns, *EVENT_METADATA),
                    ),
                    silver.transform,
                    self.spec.name,
                    batch_id,
                )
                events = transformed
                has_deletes = True  # the transform may have made deletes: let the MERGE see
            writes: list[TableWrite] = []
            if event_count:
                writes.append(
                    append_idempotently(
                        events,
                        silver.events.table,
                        "events",
                        self.events_path,
                        self.app_id(silver.events.table),
                        batch_id,
                        ("_event_date",),
                    )
                )
            if counts["quarantined"]:
                writes.append(
                    append_idempotently(
                        quarantine_of(parsed, self.spec.name),
                        silver.quarantine.table,
                        "quarantine",
                        self.quarantine_path,
                        self.app_id(silver.quarantine.table),
                        batch_id,
                    )
                )
            if silver.current is not None and event_count:
                writes += self._merge(events, batch_id, has_deletes)
            if silver.history is not None and event_count:
                writes += self._merge_history(events, batch_id)
            quality = batch_quality(counts, expectations, event_count, columns_added)
        finally:
            parsed.unpersist()
            if transformed is not None:
                transformed.unpersist()
        commit = BatchCommit(
            flow=self.spec.name,
            batch_id=batch_id,
            table_version=next(
                (w.version for w in reversed(writes) if w.role not in ("deleted_keys", "history")),
                None,
            ),
            rows_added=sum(w.rows for w in writes if w.role == "events"),
            replayed=bool(writes) and all(w.skipped for w in writes),
            stage=STAGE,
            writes=tuple(writes),
            quality=quality.to_dict(),
        )
        self.on_commit(commit)
        return commit

    def _merge(
        self, events: DataFrame, batch_id: int, has_deletes: bool = True
    ) -> list[TableWrite]:
        silver = self.silver
        assert silver.current is not None
        assert self.current_path is not None and self.deleted_path is not None
        spark = events.sparkSession
        deleted_keys = spark.read.format("delta").load(self.deleted_path)
        if silver.current.ignore_null_updates:
            stored = spark.read.format("delta").load(self.current_path)
            events = current_state.drop_stale(events, stored, deleted_keys, silver)
        reduced = current_state.reduce_batch(events, silver, self.row_columns).persist()
        try:
            source = current_state.drop_deleted(reduced, deleted_keys, silver)
            writes = [
                self._merge_into(
                    spark,
                    silver.current.table,
                    "current",
                    self.current_path,
                    batch_id,
                    lambda target: current_state.merge_current(
                        target, source, silver, self.row_columns
                    ),
                )
            ]
            if has_deletes:
                table = f"{silver.current.table}__deleted_keys"
                writes.append(
                    self._merge_into(
                        spark,
                        table,
                        "deleted_keys",
                        self.deleted_path,
                        batch_id,
                        lambda target: current_state.merge_deleted_keys(target, reduced, silver),
                    )
                )
            return writes
        finally:
            reduced.unpersist()

    def _merge_history(self, events: DataFrame, batch_id: int) -> list[TableWrite]:
        """Recompute the versions of the batch's keys from the events table; MERGE what changed.

        Nothing changed (e.g. the replay of a batch whose MERGE committed) writes nothing.
        """
        history = self.silver.history
        assert history is not None and self.history_path is not None
        plan = self._history_plan()
        spark = events.sparkSession
        changes = history_state.history_changes(
            events,
            spark.read.format("delta").load(self.events_path),
            spark.read.format("delta").load(self.history_path),
            plan,
        ).persist()
        try:
            if changes.count() == 0:  # fills the cache: the MERGE reads its source twice
                return []
            return [
                self._merge_into(
                    spark,
                    history.table,
                    "history",
                    self.history_path,
                    batch_id,
                    lambda target: history_state.merge_history(target, changes, plan),
                )
            ]
        finally:
            changes.unpersist()

    def _merge_into(
        self,
        spark: SparkSession,
        table: str,
        role: str,
        path: str,
        batch_id: int,
        merge: Callable[[DeltaTable], None],
    ) -> TableWrite:
        app_id = self.app_id(table)
        before = delta_version(spark, path)
        with idempotent_session(spark, app_id, batch_id):
            retry_on_maintenance(lambda: merge(DeltaTable.forPath(spark, path)), table, batch_id)
        return committed_write(spark, table, role, path, before, app_id, batch_id)

"""Silver stage: parse bronze rows into an events table, a current-state table and a quarantine.

One micro-batch of bronze rows is parsed once (:func:`pipelines.silver.parse.parse_batch`) and
held (:mod:`pipelines.held`: computed once, its lineage cut), then written, each write idempotent under the batch id with an app id of its own
table (``conflux-<flow id>-g<generation>-<table>``; see :mod:`pipelines.delta_writes`):

1. when the spec declares ``current``, the batch reduced to one row per key, MERGEd into the
   **current-state table**, and its deletes into the deleted-keys side table
   (:mod:`pipelines.silver.current`): first, because it is the table readers wait for, and it
   reads only the batch's own events;
2. the events that parsed to the append-only **events table**, partitioned by ``_event_date``:
   downstream streams and date-range backfills read it (a Delta stream cannot follow a table that
   MERGE rewrites);
3. the records that did not to the **quarantine table**, with their bytes and reasons;
4. when the spec declares ``history``, the versions of the batch's keys, recomputed from the
   events table (so after the events append), MERGEd into the **history table**
   (:mod:`pipelines.silver.history`).

A spec's ``transform`` (:mod:`pipelines.silver.transform`) rewrites the parsed events before any
of these writes; the tables are designed from its output schema. With ``format: debezium`` the
events then lose the changes the connector delivered again, an unsent TOAST value is carried from
the key's earlier changes before the rows are judged, and a TRUNCATE is applied
(:mod:`pipelines.stages.silver_changes`, :mod:`pipelines.silver.changes`).

Empty writes are skipped (one aggregation over the held batch counts the three kinds of rows
first). The stage runs either as its own query reading the bronze table as a Delta stream, with its
own checkpoint (``chaining: stream``), or inside the bronze query's ``foreachBatch`` on the rows
bronze writes, before bronze appends them (``chaining: bronze_batch``; see
:meth:`pipelines.stages.bronze.BronzeStage.write_with`); the batch id, and so the idempotence, is
that of the query it runs in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.catalog.lifecycle import TableDesign, ensure_table
from pipelines.catalog.roles import SILVER_STAGE, TableRole
from pipelines.catalog.tables import CatalogTable, FlowCatalog
from pipelines.delta_writes import (
    BACKGROUND_CHECKPOINT_PROPERTIES,
    TableWrite,
    append_idempotently,
    committed_write,
    idempotent_session,
    retry_on_maintenance,
)
from pipelines.held import hold, release
from pipelines.identity import (
    FlowIdentity,
    checkpoint_has_commits,
    checkpoint_has_offsets,
    read_identity,
)
from pipelines.lease import LeaseGuard
from pipelines.location import Location
from pipelines.progress import BatchCommit, delta_version
from pipelines.settings import Settings
from pipelines.silver import changes
from pipelines.silver import current as current_state
from pipelines.silver import history as history_state
from pipelines.silver.bound_plan import BoundPlan
from pipelines.silver.changes import truncated_before
from pipelines.silver.expectations import (
    ExpectationFailedError,
    batch_aggregates,
    batch_quality,
    failure_message,
    failures,
    with_expectations,
)
from pipelines.silver.parse import (
    EVENT_METADATA,
    PARSER_COLUMNS,
    TRUNCATE,
    bronze_rows_of,
    events_of,
    parse_batch,
    quarantine_of,
    with_batch_id,
)
from pipelines.silver.refresh import (
    SilverRefresh,
    begin_refresh,
    complete_refresh,
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
from pipelines.silver.steps import FrameSteps
from pipelines.silver.transform import (
    Transform,
    apply_transform,
    materialize,
)
from pipelines.spec import FlowSpec, SilverSpec
from pipelines.stages.base import QueryStage
from pipelines.stages.silver_changes import SilverChanges
from pipelines.stages.silver_design import SilverDesign

STAGE = SILVER_STAGE
log = logging.getLogger(__name__)
ParseSteps = tuple[FrameSteps, FrameSteps, BoundPlan]


class SilverStage(SilverDesign, SilverChanges, QueryStage):
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
        self.catalog = FlowCatalog.of(spec, settings)
        self.locations = self.catalog.state
        self.settings = settings
        self.guard = guard
        self.on_commit = on_commit
        self.query_name = f"{spec.name}.{STAGE}"
        self.own_query = self.silver.own_query
        if full_refresh:
            self.refresh: SilverRefresh | None = begin_refresh(spec, settings)
        else:
            refuse_pending(spec, settings)
            self.refresh = None
        self.checkpoint: Location = (
            self.locations.silver_checkpoint if self.own_query else self.locations.checkpoint
        )
        if self.refresh is not None:
            self.checkpoint = self.locations.refresh_checkpoint
        #: The silver tables, each with where this run writes it (a refresh: beside it).
        self.written: dict[TableRole, tuple[CatalogTable, str]] = {
            table.role: (table, self._located(table)) for table in self.catalog.written_by(STAGE)
        }
        self.events_path = self.written[TableRole.EVENTS][1]
        self.current_path = self._path(TableRole.CURRENT)
        self.deleted_path = self._path(TableRole.DELETED_KEYS)
        self.history_path = self._path(TableRole.HISTORY)
        self.tables = {
            table.id: (table.name, path)
            for table, path in self.written.values()
            if not table.is_side_table
        }
        #: The table a batch's reported version is of: current, else history, else events.
        self.main_role = next(
            r for r in (TableRole.CURRENT, TableRole.HISTORY, TableRole.EVENTS) if self._path(r)
        )
        self.main_table = self.written[self.main_role][1]
        self.identity: FlowIdentity | None = None
        self.transform: Transform | None = None
        #: The parsed (and transformed) row's columns, without the metadata: set by designs().
        self.row_columns: tuple[str, ...] = self.silver.columns()
        #: The schema's columns as the spec declares them (not those evolved since).
        self.spec_columns = self.silver.declared_columns()
        #: Undeclared fields already logged as impossible column names.
        self.skipped_fields: set[str] = set()
        #: judged -> (the spec it was built for; its parse, judge, both bound): _parse_steps.
        self._parse_cache: dict[bool, tuple[SilverSpec, ParseSteps]] = {}

    def _located(self, table: CatalogTable) -> str:
        """Where this run writes ``table``: beside the live one during a full refresh."""
        return table.rebuilt_location if self.refresh is not None else table.location

    def _path(self, role: TableRole) -> str | None:
        """Where this run writes the silver table of ``role`` (None: the flow has none)."""
        entry = self.written.get(role)
        return None if entry is None else entry[1]

    def app_id(self, role: TableRole) -> str:
        assert self.identity is not None, "prepare() runs before any batch"
        generation = self.refresh.generation if self.refresh is not None else None
        return self.written[role][0].app_id(self.identity, generation)

    def _design(self, role: TableRole, schema: StructType, **more: Any) -> TableDesign:
        """What the spec says the silver table of ``role`` must be: created to be checkpointed
        off the batch's path, as bronze is (:data:`pipelines.delta_writes.
        BACKGROUND_CHECKPOINT_PROPERTIES`; with Delta's default, every tenth batch waits for each
        table's checkpoint: bench/HISTORY.md, "Silver freshness, eleventh session").
        A property the spec sets wins; a table created before checkpoints as it did."""
        table, path = self.written[role]
        more["delta_properties"] = {
            **BACKGROUND_CHECKPOINT_PROPERTIES,
            **more.get("delta_properties", {}),
        }
        return TableDesign(entry=table, path=path, schema=schema, **more)

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        """After a clean end of the run: swap a full refresh's rebuilt tables in."""
        if self.refresh is None:
            return []
        return complete_refresh(spark, self.spec, self.settings)

    # -- start -------------------------------------------------------------------------------

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

    def _parse(
        self,
        bronze_rows: DataFrame,
        batch_id: int,
        judged: bool = True,
        unsent: Sequence[str] = (),
        held: list[DataFrame] | None = None,
    ) -> DataFrame:
        """Parse a batch: rows, schema changes (policy reasons, rescued fields), (if ``judged``)
        expectations, in one projection built (:mod:`pipelines.silver.steps`) and planned
        (:mod:`pipelines.silver.bound_plan`) once per spec and input; then the batch id. ``unsent``:
        columns with Debezium's TOAST placeholder, carried from stored rows before judging, the
        parse held first (in ``held``, for the caller to release): the carry reads it thrice."""
        parse, judge, bound = self._parse_steps(judged)
        if judged and not unsent:  # unjudged: the design's one parse of no rows
            return with_batch_id(bound.apply(bronze_rows), batch_id)
        parsed = with_batch_id(parse.apply(bronze_rows), batch_id)
        if unsent:
            assert held is not None, "the caller releases the held parse"
            held.append(parsed := hold(parsed))
            parsed = self._carry_unavailable(parsed, unsent, batch_id)
        return judge.apply(parsed)

    def _parse_steps(self, judged: bool) -> ParseSteps:
        """The recorded parse of the current spec (evolving columns makes a new one)."""
        silver = self.silver
        cached = self._parse_cache.get(judged)
        if cached is not None and cached[0] is silver:
            return cached[1]
        parse = FrameSteps.record(lambda frame: parse_batch(frame, silver, 0))

        def judge(frame: DataFrame) -> DataFrame:
            frame = with_record_fields(frame, silver, self.spec_columns)
            return with_expectations(frame, silver.expectations) if judged else frame

        judging = FrameSteps.record(judge)
        steps = (parse, judging, BoundPlan(lambda frame: judging.apply(parse.apply(frame))))
        self._parse_cache[judged] = (silver, steps)
        return steps

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
                failure_message(self.spec.name, self.spec.spec_file, batch_id, failed),
                names=[e.name for e, _, _ in failed],
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
        parsed, counts, columns_added = self._parsed_batch(bronze_rows, batch_id)
        held: list[DataFrame] = []
        try:
            silver = self.silver
            expectations = silver.expectations
            events, event_count, truncated_at = self._events(parsed, counts, batch_id, held)
            has_deletes = counts["deletes"] > 0 or truncated_at is not None
            has_deletes |= silver.transform is not None  # it may make deletes: the MERGE sees
            writes: list[TableWrite] = []
            # The current table first: it is what readers wait for (freshness), and it reads
            # only this batch's events; history recomputes from the events table, so it comes
            # after the events append.
            if silver.current is not None and event_count:
                writes += self._merge(events, batch_id, has_deletes, truncated_at)
            if event_count:
                writes.append(self._append(events, TableRole.EVENTS, batch_id))
            if counts["quarantined"]:
                writes.append(
                    self._append(
                        quarantine_of(parsed, self.spec.name), TableRole.QUARANTINE, batch_id
                    )
                )
            if silver.history is not None and event_count:
                writes += self._merge_history(events, batch_id, truncated_at is not None)
            quality = batch_quality(counts, expectations, event_count, columns_added)
        finally:
            release(parsed)
            for frame in held:
                release(frame)
        roles = {table.id: role for role, (table, _) in self.written.items()}
        commit = BatchCommit(
            flow=self.spec.name,
            batch_id=batch_id,
            # the version of the flow's main table (current, else history, else events)
            table_version=next(
                (w.version for w in writes if roles[w.role] is self.main_role), None
            ),
            rows_added=sum(w.rows for w in writes if roles[w.role] is TableRole.EVENTS),
            replayed=bool(writes) and all(w.skipped for w in writes),
            stage=STAGE,
            writes=tuple(writes),
            quality=quality,
        )
        self.on_commit(commit)
        return commit

    def _parsed_batch(
        self, bronze_rows: DataFrame, batch_id: int
    ) -> tuple[DataFrame, dict[str, Any], list[str]]:
        """The batch parsed and held, its counts, and the columns it evolved into the tables.

        Parsed again (from the held rows' bytes) when it holds Debezium's TOAST placeholders, to
        carry the stored values into them before the expectations judge the rows, and when it
        evolved columns. A ``fail`` expectation or schema-change policy raises here, before any
        write."""
        parsed = hold(self._parse(bronze_rows, batch_id))
        columns_added: list[str] = []
        unsent: list[str] = []
        try:
            counts = self._count(parsed)
            if counts.get("unavailable"):
                unsent = changes.unavailable_columns(parsed)
                parsed, counts = self._parse_again(parsed, batch_id, unsent)
            self._raise_failures(counts, batch_id)  # before any write, evolving included
            undeclared = list(counts.get("undeclared_columns") or [])
            if undeclared:
                columns_added = self._evolve(parsed, undeclared, batch_id)
                if columns_added:  # parse the batch again, with the new columns
                    parsed, counts = self._parse_again(parsed, batch_id, unsent)
        except BaseException:
            release(parsed)
            raise
        return parsed, counts, columns_added

    def _parse_again(
        self, parsed: DataFrame, batch_id: int, unsent: Sequence[str]
    ) -> tuple[DataFrame, dict[str, Any]]:
        """The batch parsed again from ``parsed``'s bronze rows (released), and its counts."""
        raw: list[DataFrame] = []
        try:
            again = hold(self._parse(bronze_rows_of(parsed), batch_id, unsent=unsent, held=raw))
        finally:
            release(parsed)
            for frame in raw:
                release(frame)
        return again, self._count(again)

    def _events(
        self, parsed: DataFrame, counts: dict[str, Any], batch_id: int, held: list[DataFrame]
    ) -> tuple[DataFrame, int, object | None]:
        """The batch's events as the tables get them (transformed, then without the changes
        Debezium delivered again), their number, and the sequence of its last TRUNCATE (None
        without one). Frames held on the way are added to ``held``."""
        silver = self.silver
        events, event_count = events_of(parsed, silver), int(counts["events"])
        if self.transform is not None and silver.transform is not None and event_count:
            events, event_count = materialize(
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
            held.append(events)
        if silver.format == "debezium" and event_count:
            deduplicated = self._without_redelivered(events, event_count, batch_id)
            held.extend(deduplicated.held)
            events, kept = deduplicated.events, deduplicated.count
            counts["events"], counts["passed"] = kept, counts["passed"] - (event_count - kept)
            counts["ignored"] += event_count - kept  # delivered again: counted, not stored
            event_count = kept
        truncated_at = truncated_before(events) if counts["truncates"] else None
        return events, event_count, truncated_at

    def _merge(
        self,
        events: DataFrame,
        batch_id: int,
        has_deletes: bool = True,
        truncated_at: object | None = None,
    ) -> list[TableWrite]:
        silver = self.silver
        assert silver.current is not None
        assert self.current_path is not None and self.deleted_path is not None
        spark = events.sparkSession
        events = events.where(F.col("_op") != TRUNCATE)
        if truncated_at is not None:  # what the batch's last TRUNCATE left
            events = events.where(F.col("_sequence") > F.lit(truncated_at))
        deleted_keys = spark.read.format("delta").load(self.deleted_path)
        if silver.current.ignore_null_updates:
            stored = spark.read.format("delta").load(self.current_path)
            events = current_state.drop_stale(events, stored, deleted_keys, silver)
        reduced = hold(current_state.reduce_batch(events, silver, self.row_columns))
        try:
            source = current_state.drop_deleted(reduced, deleted_keys, silver)
            writes = [
                self._merge_into(
                    spark,
                    TableRole.CURRENT,
                    batch_id,
                    lambda target: current_state.merge_current(
                        target, source, silver, self.row_columns, truncated_at
                    ),
                )
            ]
            if has_deletes:
                writes.append(
                    self._merge_into(
                        spark,
                        TableRole.DELETED_KEYS,
                        batch_id,
                        lambda target: current_state.merge_deleted_keys(
                            target, reduced, silver, truncated_at
                        ),
                    )
                )
            return writes
        finally:
            release(reduced)

    def _merge_history(
        self, events: DataFrame, batch_id: int, truncates: bool = False
    ) -> list[TableWrite]:
        """Recompute the versions of the batch's keys from the events table; MERGE what changed.

        Nothing changed (e.g. the replay of a batch whose MERGE committed) writes nothing.
        """
        history = self.silver.history
        assert history is not None and self.history_path is not None
        plan = self._history_plan()
        spark = events.sparkSession
        changes = hold(
            history_state.history_changes(
                events,
                spark.read.format("delta").load(self.events_path),
                spark.read.format("delta").load(self.history_path),
                plan,
                self._truncates(truncates),
            )
        )
        try:
            if changes.isEmpty():
                return []
            return [
                self._merge_into(
                    spark,
                    TableRole.HISTORY,
                    batch_id,
                    lambda target: history_state.merge_history(target, changes, plan),
                )
            ]
        finally:
            release(changes)

    def _merge_into(
        self,
        spark: SparkSession,
        role: TableRole,
        batch_id: int,
        merge: Callable[[DeltaTable], None],
    ) -> TableWrite:
        table, path = self.written[role]
        app_id = self.app_id(role)
        before = delta_version(spark, path)
        with idempotent_session(spark, app_id, batch_id, target=path):
            retry_on_maintenance(
                lambda: merge(DeltaTable.forPath(spark, path)), table.name, batch_id
            )
        return committed_write(spark, table.name, table.id, path, before, app_id, batch_id)

    def _append(self, frame: DataFrame, role: TableRole, batch_id: int) -> TableWrite:
        table, path = self.written[role]
        return append_idempotently(
            frame, table.name, table.id, path, self.app_id(role), batch_id, table.partition_by
        )

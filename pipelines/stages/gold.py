"""Gold stages: windowed aggregates of the silver events by event time, late rows captured.

Each gold table of a spec runs as two streaming queries, one after the other in a flow's phases:

1. **the split** (``<flow>.gold.<table>.split``, stateless, :class:`GoldSplitStage`) reads the
   silver events table as a Delta stream and sorts each micro-batch's rows by Conflux's own
   watermark (:mod:`pipelines.gold.watermark`): rows with a null event time, or one beyond their
   ingestion time plus ``max_future_skew``, go to the flow's quarantine with the reason; late rows
   (:mod:`pipelines.gold.windows`) to the **late-data table**, their silver row whole (in
   ``_event``, :mod:`pipelines.gold.late`) with their event time, the watermark at arrival and
   the window they missed; on-time rows to the gold **input table**
   (``<gold>__input``). All three appends carry the batch's transaction id, so a replay adds
   nothing twice, and every batch accounts for its rows: ``rows in = on time + late +
   quarantined``.
2. **the aggregation** (``<flow>.gold.<table>``, stateful, :class:`GoldStage`) reads the input
   table as a Delta stream with Spark's watermark on the event time (the same allowed lateness),
   optionally ``dropDuplicatesWithinWatermark``, groups by window and keys on the RocksDB state
   store (changelog checkpointing; :data:`pipelines.spark.STATE_STORE_CONF`) and writes in
   update mode: every committed batch MERGEs the windows it changed into the **gold table**
   (partitioned by the window start's date) under its transaction id, so open windows are
   visible at once and a replay changes nothing.

Conflux's watermark is never below Spark's (Spark's sees only rows the split already saw; for
joins, see :mod:`pipelines.gold.joins`), so Spark never drops a row the split let through: what Spark would drop is in the late-data table,
and a backfill (:mod:`pipelines.gold.backfill`) of its dates puts it into gold. The input table's
versions are read whole (``maxFilesPerTrigger`` far above a split batch's files), so a stateful
batch never advances Spark's watermark past rows of a split batch it has not read yet.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from pipelines.catalog.lifecycle import TableDesign, ensure_table
from pipelines.catalog.roles import TableRole, gold_quarantine_id, gold_stage
from pipelines.catalog.tables import CatalogTable, FlowCatalog
from pipelines.delta_writes import (
    TableWrite,
    append_idempotently,
    committed_write,
    idempotent_session,
    retry_on_maintenance,
)
from pipelines.errors import ConfigError
from pipelines.gold import COORDINATES
from pipelines.gold.late import (
    EVENT_ROW,
    grow_late_table,
    late_rows,
    late_schema,
    row_types,
    whole_row,
    whole_row_column,
    whole_row_type,
)
from pipelines.gold.watermark import (
    EVENTS,
    WatermarkLog,
    WatermarkRecord,
    micros_column,
    micros_to_iso,
)
from pipelines.gold.windows import (
    FILTERED,
    FUTURE_TIME,
    GOLD_PROPERTY,
    LATE,
    NULL_TIME,
    ON_TIME,
    aggregate_columns,
    earliest_window_end,
    gold_columns,
    late_condition,
    row_class,
    window_column,
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
from pipelines.messages import GoldQuality
from pipelines.progress import BatchCommit, delta_version
from pipelines.settings import Settings
from pipelines.spec import AnyGold, FlowSpec, GoldSpec, duration_seconds
from pipelines.stages.base import QueryStage

#: Far above the files one split batch writes: a stateful batch reads whole input versions.
WHOLE_VERSIONS = "1000000"


def checkpoint_epoch(epoch_file: Location) -> str:
    """A random id made with the split checkpoint (kept in it: :meth:`FlowState.epoch_file`).
    The flow's quarantine outlives a ``reset --stage gold``, whose new checkpoint restarts batch
    ids at 0: its appends from the new checkpoint carry a new app id, so Delta does not skip them
    as replays."""
    epoch_file.create(json.dumps({"epoch": uuid.uuid4().hex[:12]}).encode())  # if absent
    return str(json.loads(epoch_file.read_text())["epoch"])


def rebuild_hint(spec: FlowSpec) -> str:
    return (
        f"`conflux reset {spec.name} --stage gold` (moves the gold tables and checkpoints aside; "
        "the next run rebuilds them from the silver events)"
    )


class _GoldBase(QueryStage):
    """What both queries of one gold table share: locations, identity, the input schema."""

    own_query = True
    output_mode = "append"
    reads_flows: tuple[str, ...] = ()
    #: What follows ``gold.<table>`` in the stage's kind (and its query's name).
    kind_suffix = ""

    def __init__(
        self,
        spec: FlowSpec,
        gold: AnyGold,
        settings: Settings,
        guard: LeaseGuard | None,
        on_commit: Callable[[BatchCommit], None],
    ) -> None:
        assert spec.silver is not None, "validated: gold reads the silver events"
        self.spec, self.gold, self.settings = spec, gold, settings
        self.guard, self.on_commit = guard, on_commit
        kind = gold_stage(gold.table, split=self.kind_suffix == ".split")
        self.kind = kind
        self.query_name = f"{spec.name}.{kind}"
        self.catalog = FlowCatalog.of(spec, settings)
        self.locations = self.catalog.state
        self.checkpoint: Location = self.locations.stage_checkpoint(kind)
        self.events_path = self.catalog.table(TableRole.EVENTS).location
        self.quarantine = self.catalog.table(TableRole.QUARANTINE)
        self.quarantine_path = self.quarantine.location
        self.quarantine_table = self.quarantine.name
        self.gold_entry = self.catalog.table(TableRole.GOLD, gold.table)
        self.late_entry = self.catalog.table(TableRole.LATE, gold.table)
        self.input_entry = self.catalog.table(TableRole.GOLD_INPUT, gold.table)
        self.gold_path = self.gold_entry.location
        self.late_path = self.late_entry.location
        self.input_path = self.input_entry.location
        self.input_table = self.input_entry.name
        self.identity: FlowIdentity | None = None
        self.main_table, self.tables = self._own_tables()

    def _own_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        """The stage's main table, and role -> (table, path) of the tables it writes."""
        raise NotImplementedError

    def app_id(self, table: CatalogTable) -> str:
        assert self.identity is not None, "prepare() runs before any batch"
        return table.app_id(self.identity)

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        return []

    def _append(self, frame: DataFrame, table: CatalogTable, batch_id: int) -> TableWrite:
        """Append ``frame`` to one of the gold table's own tables under the batch's txn id."""
        return append_idempotently(
            frame,
            table.name,
            table.id,
            table.location,
            self.app_id(table),
            batch_id,
            table.partition_by,
        )

    def _committed(self, batch_id: int, writes: list[TableWrite]) -> BatchCommit:
        """The batch's commit (its first write's version), reported."""
        commit = BatchCommit(
            flow=self.spec.name,
            batch_id=batch_id,
            table_version=writes[0].version if writes else None,
            rows_added=sum(w.rows for w in writes),
            replayed=bool(writes) and all(w.skipped for w in writes),
            stage=self.kind,
            writes=tuple(writes),
        )
        self.on_commit(commit)
        return commit

    def _events_schema(
        self, spark: SparkSession, events_path: str, columns: tuple[str, ...], event_time: str,
        where: str,
    ) -> StructType:  # fmt: skip
        """The schema of an events table, which must have ``columns``, the row coordinates and
        the TIMESTAMP ``event_time``."""
        where = f"{self.spec.spec_file}: gold ({self.gold.table}){where}"
        if not DeltaTable.isDeltaTable(spark, events_path):
            raise ConfigError(
                f"{where}: no silver events table at {events_path} yet: run its flow first (or "
                "in the same application)"
            )
        events = spark.read.format("delta").load(events_path).schema
        names = [*columns, event_time, *COORDINATES]
        missing = [n for n in names if n not in events.fieldNames()]
        if missing:
            raise ConfigError(
                f"{where}: the silver events table has no column {', '.join(missing)} (its "
                f"columns: {', '.join(events.fieldNames())}); name columns of the events"
            )
        event_type = events[event_time].dataType.simpleString()
        if event_type not in ("timestamp", "timestamp_ntz", "date"):
            raise ConfigError(
                f"{where}: event_time {event_time!r} is {event_type} in the events table; "
                "give a TIMESTAMP column"
            )
        return events

    def _design(self, table: CatalogTable, schema: StructType, **more: Any) -> TableDesign:
        return TableDesign(
            entry=table,
            path=table.location,
            schema=schema,
            spec_properties={GOLD_PROPERTY: self.gold.design_key()},
            spec_field=f"gold ({self.gold.table})",
            rebuild=rebuild_hint(self.spec),
            stage=f"gold {self.gold.table}",
            **more,
        )

    def _gold_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        """What the stateful query writes: the gold table."""
        return self.gold_path, {self.gold_entry.id: (self.gold.table, self.gold_path)}

    def _prepare_gold(self, spark: SparkSession, schema: StructType) -> None:
        """Create or check the gold table (partitioned by event date, for backfills)."""
        self._prepare_tables(
            spark,
            [
                self._design(
                    self.gold_entry,
                    schema,
                    partition_by=self.gold_entry.partition_by,
                    delta_properties=self.gold.delta_properties(),
                    stated_properties=self.gold.stated_properties(),
                )
            ],
        )

    def _prepare_tables(self, spark: SparkSession, designs: list[TableDesign]) -> None:
        identity = read_identity(self.locations)
        assert identity is not None, "the bronze stage writes the flow's identity first"
        self.identity = identity
        committed = checkpoint_has_commits(self.checkpoint)
        started = checkpoint_has_offsets(self.checkpoint)
        for design in designs:
            ensure_table(spark, design, identity, committed, self.spec.spec_file, started)


class SplitStage(_GoldBase):
    """The split query of one gold table (see the module doc): what every kind of gold table
    shares. A kind says which sides its rows come from, when a row is late, and what a late row
    records."""

    kind_suffix = ".split"
    #: The inputs the split reads (each keeps its own maximum event time).
    sides: tuple[str, ...] = (EVENTS,)

    def _own_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        gold = self.gold
        self.watermarks = WatermarkLog(
            self.locations.watermark_log(gold.table),
            duration_seconds(gold.allowed_lateness),
            self.sides,
        )
        return self.input_path, {
            table.id: (table.name, table.location) for table in (self.late_entry, self.input_entry)
        }

    def _prepare_split(
        self, spark: SparkSession, schema: StructType, missed: Sequence[StructField],
        whole: Mapping[str, StructType],
    ) -> None:  # fmt: skip
        """Create or check the input and late tables, and the quarantine epoch. The late table
        (:func:`pipelines.gold.late.late_schema`): the input's columns, ``whole`` (the late
        table's columns holding the silver row whole -> its type), the date, the watermark,
        ``missed`` (what the row missed) and the batch; a table of an older layout grown first."""
        wanted = late_schema(
            schema, missed, whole, f"{self.spec.spec_file}: gold ({self.gold.table})"
        )
        late = grow_late_table(spark, self.late_entry, wanted, whole, read_identity(self.locations))
        self._prepare_tables(
            spark,
            [
                self._design(self.input_entry, schema),
                self._design(self.late_entry, late, partition_by=self.late_entry.partition_by),
            ],
        )
        #: The late table's whole-row columns -> their struct type, as the table has them.
        self.whole = row_types(late, whole)
        self.columns = schema.fieldNames()
        self.epoch = checkpoint_epoch(self.locations.epoch_file(self.gold.table))

    def _side(self) -> Column:
        """Which side a row of the batch comes from."""
        return F.lit(EVENTS)

    def _row_watermark(
        self, batch_id: int, record: WatermarkRecord | None, rows: DataFrame
    ) -> tuple[Column, dict[str, Any]]:
        """The watermark each row of the batch is judged by (a timestamp Column; null: none yet)
        and what the batch's progress reports of it. Here: Conflux's watermark before the batch."""
        watermark = record.watermark_micros if record is not None else None
        return micros_column(watermark), {"watermark": micros_to_iso(watermark)}

    def _late(self, watermark: Column) -> Column:
        """Whether a row is late under ``watermark`` (its :meth:`_row_watermark`)."""
        raise NotImplementedError

    def _late_columns(self) -> list[Column]:
        """What a late row records beyond its row, date, watermark and batch."""
        raise NotImplementedError

    def _event_time_name(self) -> Column:
        """The event-time column a row was judged by, as the spec names it (for reasons)."""
        raise NotImplementedError

    def _rows(self, events: DataFrame) -> DataFrame:
        return events

    def _filtered(self) -> Column:
        """Rows the gold table does not read at all (a join side's ``where``)."""
        return F.lit(False)

    def _source_flow(self) -> Column:
        """The flow whose events a row is (for the quarantine)."""
        return F.lit(self.spec.name)

    def write_batch(self, events: DataFrame, batch_id: int) -> BatchCommit:
        if self.guard is not None:
            self.guard.check()
        gold = self.gold
        record = self.watermarks.before(batch_id)
        event_time = F.col("_event_time")
        base = self._rows(events).withColumn("_gold_side", self._side()).persist()
        try:
            watermark, reported = self._row_watermark(batch_id, record, base)
            late = self._late(F.col("_gold_watermark"))
            rows = base.withColumn("_gold_watermark", watermark).withColumn(
                "_gold_class",
                F.when(self._filtered(), F.lit(FILTERED)).otherwise(
                    row_class(event_time, F.col("_ingested_at"), late, gold.max_future_skew)
                ),
            )
            judged = F.col("_gold_class").isin(ON_TIME, LATE)
            counts = rows.agg(
                F.count(F.lit(1)).alias("rows_in"),
                *(
                    F.count(F.when(F.col("_gold_class") == c, 1)).alias(c)
                    for c in (ON_TIME, LATE, NULL_TIME, FUTURE_TIME, FILTERED)
                ),
                *(
                    F.max(
                        F.when(judged & (F.col("_gold_side") == side), F.unix_micros(event_time))
                    ).alias(f"max_{side}")
                    for side in self.sides
                ),
            ).first()
            assert counts is not None
            writes: list[TableWrite] = []
            if counts[ON_TIME]:
                writes.append(
                    self._append(
                        rows.where(F.col("_gold_class") == ON_TIME).select(*self.columns),
                        self.input_entry,
                        batch_id,
                    )
                )
            if counts[LATE]:
                writes.append(
                    self._append(self._late_rows(rows, batch_id), self.late_entry, batch_id)
                )
            quarantined = int(counts[NULL_TIME]) + int(counts[FUTURE_TIME])
            if quarantined:
                assert self.identity is not None, "prepare() runs before any batch"
                writes.append(
                    append_idempotently(
                        self._quarantine_rows(rows),
                        self.quarantine_table,
                        gold_quarantine_id(gold.table),
                        self.quarantine_path,
                        self.catalog.gold_quarantine_app_id(self.identity, gold.table, self.epoch),
                        batch_id,
                    )
                )
            after = self.watermarks.record(
                batch_id, {side: counts[f"max_{side}"] for side in self.sides}
            )
        finally:
            base.unpersist()
        commit = BatchCommit(
            flow=self.spec.name,
            batch_id=batch_id,
            table_version=next((w.version for w in writes if w.role == self.input_entry.id), None),
            rows_added=sum(w.rows for w in writes if w.role == self.input_entry.id),
            replayed=bool(writes) and all(w.skipped for w in writes),
            stage=self.kind,
            writes=tuple(writes),
            quality=GoldQuality(
                rows_in=int(counts["rows_in"]),
                on_time=int(counts[ON_TIME]),
                late=int(counts[LATE]),
                quarantined=quarantined,
                filtered=int(counts[FILTERED]),
                null_event_time=int(counts[NULL_TIME]),
                future_event_time=int(counts[FUTURE_TIME]),
                next_watermark=micros_to_iso(after.watermark_micros),
                max_event_time=micros_to_iso(after.max_event_micros),
                watermarks=reported,
            ),
        )
        self.on_commit(commit)
        return commit

    def _late_rows(self, rows: DataFrame, batch_id: int) -> DataFrame:
        late = rows.where(F.col("_gold_class") == LATE)
        watermark = F.col("_gold_watermark")
        return late_rows(late, self.columns, self.whole, watermark, self._late_columns(), batch_id)

    def _quarantine_rows(self, rows: DataFrame) -> DataFrame:
        gold = self.gold
        skew = f"later than its ingestion time + max_future_skew ({gold.max_future_skew})"
        what = F.concat(F.lit(f"gold {gold.table}: event time "), self._event_time_name())
        reason = F.when(
            F.col("_gold_class") == NULL_TIME, F.concat(what, F.lit(" is null"))
        ).otherwise(F.concat(what, F.lit(f" is {skew}")))
        return rows.where(F.col("_gold_class").isin(NULL_TIME, FUTURE_TIME)).select(
            self._source_flow().alias("flow"),
            F.col("_batch_id").alias("batch_id"),
            F.col("_source_topic").alias("topic"),
            F.col("_source_partition").alias("partition"),
            F.col("_source_offset").alias("offset"),
            F.lit(None).cast("timestamp").alias("kafka_timestamp"),
            F.lit(None).cast("binary").alias("raw_key"),
            F.to_json(F.struct(*self.columns)).cast("binary").alias("raw_value"),
            F.array(reason).alias("reasons"),
            F.current_timestamp().alias("quarantined_at"),
        )


class _AggregateInput(_GoldBase):
    gold: GoldSpec

    def _events(self, spark: SparkSession) -> StructType:
        """The silver events' schema, checked (see :meth:`_events_schema`)."""
        gold = self.gold
        return self._events_schema(
            spark, self.events_path, gold.input_columns(), gold.event_time, ""
        )

    def _input_schema(self, events: StructType) -> StructType:
        """The input table's columns: those of the ``events`` the gold table reads, the event
        time as ``_event_time``, and the row's coordinates."""
        gold = self.gold
        kept = [
            c for c in dict.fromkeys((*gold.input_columns(), *COORDINATES)) if c != "_event_time"
        ]
        return StructType(
            [
                *(events[c] for c in kept if c not in COORDINATES),
                StructField("_event_time", TimestampType()),
                *(events[c] for c in COORDINATES),
            ]
        )


class GoldSplitStage(SplitStage, _AggregateInput):
    """The split query of a gold table of windowed aggregates."""

    gold: GoldSpec

    def prepare(self, spark: SparkSession) -> None:
        events = self._events(spark)
        self._prepare_split(
            spark,
            self._input_schema(events),
            [
                StructField("_window_start", TimestampType()),
                StructField("_window_end", TimestampType()),
            ],
            {EVENT_ROW: whole_row_type(events)},
        )

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """The events as a Delta stream, whole versions per batch: an existing events table (a
        gold table added later, or rebuilt) is read in its first batch, which has no watermark
        yet, so rows are never judged late by the order Delta lists old files in."""
        return whole_versions(spark, self.events_path)

    def _rows(self, events: DataFrame) -> DataFrame:
        """The input columns, and the whole silver row for the late table (``_event``)."""
        picked = {c: F.col(c) for c in self.columns}
        picked["_event_time"] = F.col(self.gold.event_time).cast("timestamp")
        picked[whole_row_column(EVENT_ROW)] = whole_row(self.whole[EVENT_ROW])
        return events.select(*(column.alias(name) for name, column in picked.items()))

    def _late(self, watermark: Column) -> Column:
        return late_condition(F.col("_event_time"), watermark, self.gold)

    def _event_time_name(self) -> Column:
        return F.lit(self.gold.event_time)

    def _late_columns(self) -> list[Column]:
        end = earliest_window_end(F.col("_event_time"), self.gold)
        duration = duration_seconds(self.gold.window.duration)
        return [
            (end - F.expr(f"INTERVAL {duration} SECONDS")).alias("_window_start"),
            end.alias("_window_end"),
        ]


def whole_versions(spark: SparkSession, path: str) -> DataFrame:
    """A Delta table as a stream that reads whole table versions per batch."""
    return spark.readStream.format("delta").option("maxFilesPerTrigger", WHOLE_VERSIONS).load(path)


class GoldStage(_AggregateInput):
    """The stateful query of one gold table (see the module doc)."""

    gold: GoldSpec
    output_mode = "update"

    def _own_tables(self) -> tuple[str, dict[str, tuple[str, str]]]:
        return self._gold_tables()

    def prepare(self, spark: SparkSession) -> None:
        empty = spark.createDataFrame([], self._input_schema(self._events(spark)))
        self._prepare_gold(spark, self._aggregate(empty).select(*gold_columns(self.gold)).schema)

    def _aggregate(self, rows: DataFrame) -> DataFrame:
        gold = self.gold
        return rows.groupBy(
            window_column(F.col("_event_time"), gold).alias("window"), *gold.group_by
        ).agg(*aggregate_columns(gold))

    def input_stream(self, spark: SparkSession) -> DataFrame:
        gold = self.gold
        lateness = f"{duration_seconds(gold.allowed_lateness)} seconds"
        stream = whole_versions(spark, self.input_path).withWatermark("_event_time", lateness)
        if gold.deduplicate:
            stream = stream.dropDuplicatesWithinWatermark(list(gold.deduplicate))
        return self._aggregate(stream).select(*gold_columns(gold))

    def write_batch(self, updated: DataFrame, batch_id: int) -> BatchCommit:
        if self.guard is not None:
            self.guard.check()
        # The stateful plan runs once, here: Delta's MERGE re-plans its source (see pipelines.held)
        updated = hold(updated)
        try:
            writes: list[TableWrite] = []
            if not updated.isEmpty():
                writes.append(self._merge(updated, batch_id))
        finally:
            release(updated)
        return self._committed(batch_id, writes)

    def _merge(self, updated: DataFrame, batch_id: int) -> TableWrite:
        gold = self.gold
        spark = updated.sparkSession
        keys = ["_event_date", "window_start", "window_end"]
        condition = " AND ".join(
            [
                *(f"t.`{k}` = s.`{k}`" for k in keys),
                *(f"t.`{k}` <=> s.`{k}`" for k in gold.group_by),
            ]
        )
        app_id = self.app_id(self.gold_entry)
        before = delta_version(spark, self.gold_path)

        def merge() -> None:
            (
                DeltaTable.forPath(spark, self.gold_path)
                .alias("t")
                .merge(updated.alias("s"), condition)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )

        with idempotent_session(spark, app_id, batch_id, target=self.gold_path):
            retry_on_maintenance(merge, gold.table, batch_id)
        return committed_write(
            spark, gold.table, self.gold_entry.id, self.gold_path, before, app_id, batch_id
        )

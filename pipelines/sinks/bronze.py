"""Bronze sink: append a flow's source records to its Delta table, exactly once.

Exactly-once comes from three real mechanisms together: the source is replayable (Kafka offsets,
or the file source's log of seen files), Structured Streaming writes the planned offsets of a
batch to the checkpoint's offset log before running it, and the Delta sink records each committed
(query id, batch id) in the table's transaction log and skips a batch it already committed when a
restarted query replays it. The checkpoint location is derived from the flow
(:class:`~pipelines.locations.FlowLocations`), so it is the same on every restart.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from pipelines.locations import FlowLocations
from pipelines.settings import Settings
from pipelines.sources.kafka import read_kafka_stream
from pipelines.spec import FileSource, FlowSpec


def source_stream(spark: SparkSession, spec: FlowSpec, settings: Settings) -> DataFrame:
    """The flow's source as a streaming DataFrame in bronze shape, before ingestion columns."""
    if isinstance(spec.source, FileSource):
        from pipelines.sources.files import read_files_stream

        schema_file = FlowLocations.of(spec, settings).schema_file
        return read_files_stream(spark, spec.source, settings, schema_file)
    return read_kafka_stream(spark, spec.source, settings)


def with_ingestion_columns(frame: DataFrame) -> DataFrame:
    """Add ``ingested_at`` (the micro-batch's timestamp, stable on replay) and ``ingest_date``."""
    return frame.withColumn("ingested_at", F.current_timestamp()).withColumn(
        "ingest_date", F.to_date("ingested_at")
    )


def bronze_writer(
    spark: SparkSession, spec: FlowSpec, settings: Settings, trigger_mode: str | None = None
) -> DataStreamWriter:
    """The configured (not yet started) writer of the flow's bronze stream."""
    locations = FlowLocations.of(spec, settings)
    frame = with_ingestion_columns(source_stream(spark, spec, settings))
    writer = (
        frame.writeStream.format("delta")
        .outputMode("append")
        .queryName(spec.name)
        .option("checkpointLocation", str(locations.checkpoint))
    )
    if spec.target.partition_by:
        writer = writer.partitionBy(*spec.target.partition_by)
    if (trigger_mode or spec.trigger.mode) == "available_now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=spec.trigger.interval)


def start_bronze_query(
    spark: SparkSession, spec: FlowSpec, settings: Settings, trigger_mode: str | None = None
) -> StreamingQuery:
    """Start the flow's bronze query; ``trigger_mode`` overrides the spec's trigger mode."""
    locations = FlowLocations.of(spec, settings)
    locations.checkpoint.mkdir(parents=True, exist_ok=True)
    return bronze_writer(spark, spec, settings, trigger_mode).start(str(locations.table))

"""Sources: each kind of source is a :class:`SourceReader`, found by its spec's type.

Adding a kind of source means a spec model (``pipelines/spec/bronze.py``), a module here with its
reader, and one entry in :data:`READERS`; on the data plane nothing else dispatches on the kind
(the control plane names the source's external asset in ``assets/flows.py::source_specs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from pipelines.catalog.state import FlowState
from pipelines.settings import Settings
from pipelines.spec import FileSource, FlowSpec, KafkaSource, Source


class SourceReader(Protocol):
    """Reads one flow's source as a stream in bronze shape (before ingestion columns)."""

    def stream(self, spark: SparkSession) -> DataFrame:
        """The streaming DataFrame of the source's records."""
        ...

    def prepare_batch(self, batch: DataFrame) -> DataFrame:
        """Per micro-batch work that needs the batch's content (e.g. rescuing Parquet columns)."""
        ...


@dataclass(frozen=True)
class KafkaReader:
    source: KafkaSource
    settings: Settings

    def stream(self, spark: SparkSession) -> DataFrame:
        from pipelines.sources.kafka import read_kafka_stream

        return read_kafka_stream(spark, self.source, self.settings)

    def prepare_batch(self, batch: DataFrame) -> DataFrame:
        return batch


@dataclass(frozen=True)
class FileReader:
    source: FileSource
    settings: Settings
    locations: FlowState

    def stream(self, spark: SparkSession) -> DataFrame:
        from pipelines.sources.files import read_files_stream

        return read_files_stream(spark, self.source, self.settings, self.locations.schema_file)

    def prepare_batch(self, batch: DataFrame) -> DataFrame:
        from pipelines.sources.files import load_schema, prepare_batch

        return prepare_batch(batch, self.source, load_schema(self.locations.schema_file))


READERS: dict[type, Callable[[Source, Settings, FlowState], SourceReader]] = {
    KafkaSource: lambda source, settings, _locations: KafkaReader(source, settings),  # type: ignore[arg-type]
    FileSource: lambda source, settings, locations: FileReader(source, settings, locations),  # type: ignore[arg-type]
}


def source_reader(spec: FlowSpec, settings: Settings) -> SourceReader:
    """The reader of ``spec``'s source."""
    return READERS[type(spec.source)](spec.source, settings, FlowState.of(spec, settings))

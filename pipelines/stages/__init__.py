"""Stages: the steps of a flow (bronze, silver, ...), each a :class:`Stage`, composed by
:mod:`pipelines.flow`.

Adding a kind of stage means a module here with a class that fits :class:`Stage`, its spec section
(a model in ``pipelines/spec/``), and one entry in :data:`pipelines.flow.STAGE_KINDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from pipelines.delta_writes import TableWrite
from pipelines.location import Location
from pipelines.progress import BatchCommit


class Stage(Protocol):
    """One step of a flow: prepares its tables, then writes micro-batches of its input."""

    #: ``bronze``, ``silver``, ...
    kind: str
    #: The streaming query the stage runs as (``<flow>`` for bronze, ``<flow>.<kind>`` after it).
    query_name: str
    #: Whether the stage runs as its own query (else inside the previous stage's batches).
    own_query: bool
    #: The query's output mode: ``append``, or ``update`` for a stateful aggregation that
    #: writes every batch's changed groups.
    output_mode: str
    #: Other flows whose silver events the stage reads: an available_now run of an application
    #: that runs them too starts the stage after their silver stages caught up.
    reads_flows: tuple[str, ...]
    #: The Spark checkpoint whose batch ids the stage's writes are idempotent under.
    checkpoint: Location
    #: The table whose version progress reports (bronze: its table; silver: current or events).
    main_table: str
    #: Role (bronze, events, current, quarantine) -> (table name, path) of the tables it writes.
    tables: dict[str, tuple[str, str]]

    def prepare(self, spark: SparkSession) -> None:
        """Check the stage's tables against the spec and the checkpoint; create what is missing.

        Runs for every stage of a flow, in order, before any query starts.
        """
        ...

    def input_stream(self, spark: SparkSession) -> DataFrame:
        """The stream the stage's own query reads."""
        ...

    def write_batch(self, batch: DataFrame, batch_id: int) -> BatchCommit:
        """Write one micro-batch of the stage's input, idempotently under ``batch_id``."""
        ...

    def finish(self, spark: SparkSession) -> list[TableWrite]:
        """After the run's queries ended cleanly (e.g. swap in a full refresh's tables)."""
        ...

    def starting(self, trigger_mode: str) -> None:
        """Before the stage's own query starts, under ``trigger_mode`` (``available_now`` or
        ``continuous``): e.g. a join's split learns whether its join query runs beside it."""
        ...

    def write_with(self, batch: DataFrame, batch_id: int, fused: Sequence[Stage]) -> None:
        """Write one batch of the stage's own query, and the stages ``fused`` into it (those
        without a query of their own that follow it) on the rows it writes, under its batch id.
        A stage that cannot host fused stages refuses any (see :class:`pipelines.stages.base.QueryStage`)."""
        ...

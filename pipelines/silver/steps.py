"""A batch's parse, built once per spec and applied to every batch.

Building the parse of a silver batch (:func:`pipelines.silver.parse.parse_batch`, the schema-change
columns, the expectations) makes thousands of calls from Python into the JVM, one per column
expression: measured on the Debezium benchmark flow, ~3,500 calls and 0.6-0.8 s of the driver per
batch, for expressions that are the same in every batch. Column expressions are unresolved until
a DataFrame uses them, so they can be made once and applied to any number of DataFrames.

:class:`FrameSteps` stands in for the DataFrame while those functions run once: it records each
``withColumn`` / ``withColumns`` / ``select`` / ``drop`` with the columns the functions built, and
:meth:`FrameSteps.apply` replays them on a batch, which costs one call per step. The functions
must not read the frame (its schema, its rows): the recorder has neither, and fails loudly if
asked (``AttributeError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from pyspark.sql import DataFrame


class FrameSteps:
    """The DataFrame operations of one recorded build (see the module doc)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, tuple[Any, ...]]] = []

    @classmethod
    def record(cls, build: Callable[[DataFrame], DataFrame]) -> FrameSteps:
        """The steps ``build`` makes on the frame it is given (it must return that frame)."""
        recorder = cls()
        returned: object = build(cast(DataFrame, recorder))
        if returned is not recorder:
            raise TypeError("a recorded build must return the frame it was given, transformed")
        return recorder

    def withColumn(self, name: str, column: Any) -> FrameSteps:  # noqa: N802 - DataFrame's
        self.steps.append(("withColumn", (name, column)))
        return self

    def withColumns(self, columns: dict[str, Any]) -> FrameSteps:  # noqa: N802 - DataFrame's
        self.steps.append(("withColumns", (dict(columns),)))
        return self

    def select(self, *columns: Any) -> FrameSteps:
        self.steps.append(("select", columns))
        return self

    def drop(self, *names: Any) -> FrameSteps:
        self.steps.append(("drop", names))
        return self

    def apply(self, frame: DataFrame) -> DataFrame:
        """``frame`` with the recorded steps applied, in order."""
        for method, arguments in self.steps:
            frame = getattr(frame, method)(*arguments)
        return frame

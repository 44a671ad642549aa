"""A parse built once and replayed on each batch (no JVM: fake frames record what they get)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.silver.steps import FrameSteps


class FakeFrame:
    def __init__(self, calls: tuple[tuple[str, tuple[Any, ...]], ...] = ()) -> None:
        self.calls = calls

    def _with(self, method: str, arguments: tuple[Any, ...]) -> FakeFrame:
        return FakeFrame((*self.calls, (method, arguments)))

    def withColumn(self, name: str, column: Any) -> FakeFrame:  # noqa: N802
        return self._with("withColumn", (name, column))

    def select(self, *columns: Any) -> FakeFrame:
        return self._with("select", columns)

    def drop(self, *names: Any) -> FakeFrame:
        return self._with("drop", names)


def test_a_recorded_build_replays_its_steps_with_the_same_columns_on_every_frame() -> None:
    built: list[object] = []

    def build(frame: Any) -> Any:
        column = object()  # built once, while recording
        built.append(column)
        return frame.withColumn("a", column).select("a", "b").drop("b")

    steps = FrameSteps.record(build)
    first, second = steps.apply(FakeFrame()), steps.apply(FakeFrame())  # type: ignore[arg-type]
    expected = (("withColumn", ("a", built[0])), ("select", ("a", "b")), ("drop", ("b",)))
    assert len(built) == 1
    assert first.calls == second.calls == expected  # type: ignore[attr-defined]


def test_a_build_that_reads_the_frame_fails_while_recording() -> None:
    def reads(frame: Any) -> Any:
        return frame.withColumn("n", len(frame.columns))

    with pytest.raises(AttributeError):
        FrameSteps.record(reads)


def test_a_build_must_return_the_frame_it_transformed() -> None:
    def another(frame: Any) -> Any:
        return FakeFrame()

    with pytest.raises(TypeError, match="must return the frame"):
        FrameSteps.record(another)

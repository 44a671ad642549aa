"""A batch that lost its held rows with an executor runs again in place (pipelines/held.py), and
nothing else does: the condition is read from the exception chain, in Python and in the JVM,
never from the message's text. Fake Java exceptions stand in for Py4J's proxies (no JVM here);
on the project's cluster the same path ran when kill -9 of an executor hit a silver batch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from py4j.protocol import Py4JError
from pyspark import SparkContext

from pipelines import held
from pipelines.held import LOST_BLOCK, lost_with_an_executor, run_batch


@dataclass
class FakeJavaError:
    """A Java throwable as Py4J shows it: ``getCondition`` only on a SparkThrowable."""

    condition: str | None
    cause: FakeJavaError | None = None

    def getCondition(self) -> str | None:  # noqa: N802 (Java's name)
        return self.condition

    def getCause(self) -> FakeJavaError | None:  # noqa: N802
        return self.cause


class CapturedError(Exception):
    """Like PySpark's captured exceptions: the Java exception in ``_origin``."""

    def __init__(self, origin: FakeJavaError) -> None:
        super().__init__("Job aborted due to stage failure")
        self._origin = origin


@dataclass
class FakeContext:
    master: str


@pytest.fixture(autouse=True)
def fake_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's driver: a gateway, and a master that is not ``local[...]``."""
    monkeypatch.setattr(SparkContext, "_gateway", object())
    monkeypatch.setattr(SparkContext, "_active_spark_context", FakeContext("spark://host:7077"))
    monkeypatch.setattr(
        held, "is_instance_of", lambda _gw, obj, _cls: getattr(obj, "condition", None) is not None
    )


def lost() -> CapturedError:
    """A job aborted by a task whose held block was gone: the condition two causes down."""
    return CapturedError(
        FakeJavaError(None, FakeJavaError("INTERNAL_ERROR", FakeJavaError(LOST_BLOCK)))
    )


def test_the_condition_is_found_down_the_java_and_python_chains() -> None:
    assert lost_with_an_executor(lost())
    try:
        try:
            raise lost()
        except CapturedError as inner:
            raise RuntimeError("the Python proxy failed") from inner
    except RuntimeError as outer:
        assert lost_with_an_executor(outer)
    assert not lost_with_an_executor(CapturedError(FakeJavaError("DIVIDE_BY_ZERO")))
    assert not lost_with_an_executor(ValueError(f"text that says {LOST_BLOCK} is not enough"))


def test_a_lost_block_runs_the_batch_again_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise lost()

    run_batch(write, "shop.silver batch 7")
    assert len(calls) == 3
    err = capsys.readouterr().err
    assert "shop.silver batch 7: an executor holding the batch's intermediate rows was lost" in err
    assert "attempt 3 of 3" in err


def test_other_failures_and_one_loss_too_many_are_raised() -> None:
    calls: list[int] = []

    def fails(exc: Exception) -> None:
        calls.append(1)
        raise exc

    with pytest.raises(CapturedError):
        run_batch(lambda: fails(CapturedError(FakeJavaError("DIVIDE_BY_ZERO"))), "x")
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(CapturedError) as raised:
        run_batch(lambda: fails(lost()), "x", retries=2)
    assert len(calls) == 3
    assert raised.value.__notes__[-1].endswith("2 time(s) before this attempt")


def test_in_local_mode_a_missing_block_is_a_bug_and_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SparkContext, "_active_spark_context", FakeContext("local[2]"))
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise lost()

    with pytest.raises(CapturedError):
        run_batch(write, "x")
    assert len(calls) == 1


def test_a_jvm_that_cannot_be_asked_leaves_the_batchs_own_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_args: object) -> bool:
        raise Py4JError("the gateway is closing")  # or anything else the question raises

    monkeypatch.setattr(held, "is_instance_of", broken)
    with pytest.raises(CapturedError, match="Job aborted"):
        run_batch(lambda: (_ for _ in ()).throw(lost()), "x")

"""Why a flow stopped is known from what stopped it, never from Spark's error text (no JVM: the
Java exceptions are stand-ins with the methods Py4J proxies)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

import pytest

from pipelines.errors import ConfigError
from pipelines.identity import IdentityError
from pipelines.lease import LeaseHeldError, LeaseLostError
from pipelines.messages import StopReason
from pipelines.progress import BatchFailures
from pipelines.silver.expectations import ExpectationFailedError
from pipelines.silver.schema_changes import SchemaChangeError
from pipelines.silver.transform import TransformError
from pipelines.stops import failure_stop, jvm_reason, stop_reason


@dataclass
class JavaClass:
    name: str
    parent: JavaClass | None = None

    def getName(self) -> str:  # noqa: N802 - Java's API through Py4J
        return self.name

    def getSuperclass(self) -> JavaClass | None:  # noqa: N802
        return self.parent


OBJECT = JavaClass("java.lang.Object")
THROWABLE = JavaClass("java.lang.Throwable", OBJECT)
EXCEPTION = JavaClass("java.lang.Exception", THROWABLE)
RUNTIME = JavaClass("java.lang.RuntimeException", EXCEPTION)
IO = JavaClass("java.io.IOException", EXCEPTION)
FILE_SYSTEM = JavaClass("java.nio.file.FileSystemException", IO)
KAFKA = JavaClass("org.apache.kafka.common.KafkaException", RUNTIME)
UNKNOWN_TOPIC = JavaClass(
    "org.apache.kafka.common.errors.UnknownTopicOrPartitionException",
    JavaClass("org.apache.kafka.common.errors.InvalidMetadataException", KAFKA),
)
DATA_LOSS = JavaClass(
    "org.apache.spark.sql.kafka010.KafkaIllegalStateException",
    JavaClass("java.lang.IllegalStateException", RUNTIME),
)
STREAMING = JavaClass("org.apache.spark.sql.streaming.StreamingQueryException", EXCEPTION)


@dataclass
class JavaThrowable:
    cls: JavaClass
    message: str | None = None
    cause: JavaThrowable | None = None

    def getClass(self) -> JavaClass:  # noqa: N802
        return self.cls

    def getMessage(self) -> str | None:  # noqa: N802
        return self.message

    def getCause(self) -> JavaThrowable | None:  # noqa: N802
        return self.cause


class StandInPy4JJavaError(Exception):
    """Like py4j's Py4JJavaError: the Java exception in ``java_exception``."""

    def __init__(self, java_exception: JavaThrowable) -> None:
        super().__init__("An error occurred while calling o123.save.")
        self.java_exception = java_exception


NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ExpectationFailedError("flow a: ..."), StopReason.EXPECTATION_FAILED),
        (SchemaChangeError("flow a: ..."), StopReason.SCHEMA_CHANGE_REFUSED),
        (TransformError("silver.transform m:f failed"), StopReason.TRANSFORM_FAILED),
        (LeaseLostError("flow a: lost"), StopReason.LEASE_LOST),
        (LeaseHeldError("flow a: held by b"), StopReason.LEASE_HELD),
        (IdentityError("flow a: checkpoint and table disagree"), StopReason.CONFIG_ERROR),
        (ConfigError("bad spec"), StopReason.CONFIG_ERROR),
        (OSError(errno.ENOSPC, NO_SPACE), StopReason.DISK_FULL),
        (OSError(errno.EACCES, "denied"), StopReason.CRASH),
        (ValueError("anything else"), StopReason.CRASH),
        (RuntimeError(f"{NO_SPACE} LeaseLostError ExpectationFailedError"), StopReason.CRASH),
    ],
)
def test_a_raised_exception_stops_the_flow_for_its_type(exc: Exception, reason: StopReason) -> None:
    assert stop_reason(exc) is reason


def test_the_reason_is_found_along_the_exception_chain() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, NO_SPACE)
        except OSError as disk:
            raise RuntimeError("writing the watermark log failed") from disk
    except RuntimeError as exc:
        assert stop_reason(exc) is StopReason.DISK_FULL
    try:
        try:
            raise LeaseLostError("flow a: lost")
        except LeaseLostError:
            raise KeyError("while cleaning up") from None  # the context is suppressed
    except KeyError as exc:
        assert stop_reason(exc) is StopReason.CRASH


@pytest.mark.parametrize(
    ("throwable", "reason"),
    [
        (JavaThrowable(IO, NO_SPACE), StopReason.DISK_FULL),
        (JavaThrowable(FILE_SYSTEM, f"/lake/t/part-0.parquet: {NO_SPACE}"), StopReason.DISK_FULL),
        (
            JavaThrowable(STREAMING, "Query failed", JavaThrowable(RUNTIME, "x", JavaThrowable(IO, NO_SPACE))),
            StopReason.DISK_FULL,
        ),
        (JavaThrowable(RUNTIME, NO_SPACE), None),  # not an IOException
        (JavaThrowable(IO, "Connection reset"), None),
        (JavaThrowable(STREAMING, "Query failed", JavaThrowable(UNKNOWN_TOPIC, "gone")), StopReason.SOURCE_ERROR),
        (JavaThrowable(DATA_LOSS, "offsets out of range"), StopReason.SOURCE_ERROR),
        (JavaThrowable(STREAMING, "Kafka said UnknownTopicOrPartitionException"), None),
    ],
)  # fmt: skip
def test_a_java_failure_is_read_from_its_classes(
    throwable: JavaThrowable, reason: StopReason | None
) -> None:
    assert jvm_reason(throwable) is reason


def test_a_spark_error_raised_in_a_batch_is_read_from_its_java_exception() -> None:
    disk = StandInPy4JJavaError(JavaThrowable(RUNTIME, "Job aborted", JavaThrowable(IO, NO_SPACE)))
    assert stop_reason(disk) is StopReason.DISK_FULL
    other = StandInPy4JJavaError(JavaThrowable(RUNTIME, "Job aborted"))
    assert stop_reason(other) is StopReason.CRASH


SPARK_TEXT = (
    "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
    'call last):\n  File "pipelines/stages/silver.py", line 441, in write_batch\n'
    "    raise ExpectationFailedError(\n"
    "pipelines.silver.expectations.ExpectationFailedError: flow orders: silver batch 1: "
    "expectation positive (amount > 0) failed on 1 row(s)\n\n=== Streaming Query ===\n"
    "Identifier: orders.silver\nLogical Plan: ..."
)


def test_a_conflux_error_raised_in_a_batch_is_reported_without_the_py4j_traceback() -> None:
    raised = ExpectationFailedError(
        "flow orders: silver batch 1: expectation positive (amount > 0) failed on 1 row(s)\n"
        "a second line [failed expectations: positive]",
        names=["positive"],
    )
    stopped = failure_stop("orders", "orders.silver", raised, None, SPARK_TEXT)
    assert stopped.reason is StopReason.EXPECTATION_FAILED
    assert stopped.expectations == ("positive",)
    assert stopped.query == "orders.silver"
    assert stopped.message == f"flow orders.silver failed: ExpectationFailedError: {raised}"


def test_the_outermost_conflux_error_is_the_one_reported() -> None:
    try:
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError as inner:
            raise TransformError("silver.transform m:f failed in flow a, batch 2: ...") from inner
    except TransformError as exc:
        stopped = failure_stop("a", "a.silver", exc, None, "spark's text")
    assert stopped.reason is StopReason.TRANSFORM_FAILED
    assert stopped.message == (
        "flow a.silver failed: TransformError: silver.transform m:f failed in flow a, batch 2: ..."
    )


def test_any_other_failure_is_reported_as_spark_reported_it() -> None:
    text = "[DELTA_TABLE_NOT_FOUND] Delta table `x` doesn't exist."
    stopped = failure_stop("a", "a", ValueError("x"), None, text)
    assert (stopped.reason, stopped.message) == (StopReason.CRASH, f"flow a failed: {text}")
    kafka = JavaThrowable(STREAMING, "failed", JavaThrowable(UNKNOWN_TOPIC, "This server..."))
    stopped = failure_stop("a", "a", None, kafka, text)
    assert (stopped.reason, stopped.message) == (StopReason.SOURCE_ERROR, f"flow a failed: {text}")
    assert failure_stop("a", "a", None, None, text).reason is StopReason.CRASH


def test_a_watched_batch_function_records_what_failed_it_and_still_fails() -> None:
    failures = BatchFailures()
    calls: list[int] = []

    def write(_batch: Any, batch_id: int) -> None:
        calls.append(batch_id)
        if batch_id == 1:
            raise SchemaChangeError("flow a: silver batch 1: ... [schema change]")

    watched = failures.watch("a.silver", write)
    watched(None, 0)
    assert failures.of("a.silver") is None
    with pytest.raises(SchemaChangeError) as raised:
        watched(None, 1)
    assert failures.of("a.silver") is raised.value and calls == [0, 1]
    failures.record("a.silver", ValueError("later"))
    assert failures.of("a.silver") is raised.value  # the first failure is the cause
    assert failures.of("a") is None

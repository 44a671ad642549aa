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
from pipelines.stops import disk_full, failure_stop, java_disk_full, jvm_reason, stop_reason
from pipelines.volumes import DiskFullError, VolumeFull


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
SPARK = JavaClass("org.apache.spark.SparkException", EXCEPTION)
FS_ERROR = JavaClass("org.apache.hadoop.fs.FSError", JavaClass("java.lang.Error", THROWABLE))
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


@dataclass
class SparkThrowable(JavaThrowable):
    """A Spark error condition: its parameters are data (``getMessageParameters``)."""

    parameters: dict[str, str] | None = None

    def getMessageParameters(self) -> dict[str, str] | None:  # noqa: N802
        return self.parameters


@dataclass
class FileSystemThrowable(JavaThrowable):
    """A ``java.nio.file.FileSystemException``: the file it is about (``getFile``)."""

    file: str | None = None

    def getFile(self) -> str | None:  # noqa: N802
        return self.file


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
        (OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), StopReason.DISK_FULL),
        (DiskFullError(VolumeFull.at(errno.ENOSPC, "/proc/x")), StopReason.DISK_FULL),
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
    gone = JavaThrowable(UNKNOWN_TOPIC, "This server...")
    kafka = JavaThrowable(STREAMING, "failed", JavaThrowable(KAFKA, "wrapped", gone))
    stopped = failure_stop("a", "a", None, kafka, text)
    first = (
        f"{UNKNOWN_TOPIC.name}: This server..."  # the innermost of the source's, not the proxy's
    )
    assert (stopped.reason, stopped.message) == (
        StopReason.SOURCE_ERROR,
        f"flow a failed: {first}\n{text}",
    )
    assert stopped.first_line == f"flow a failed: {first}"
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


#: A path on /proc, a mount point on every Linux host: the volume these tests expect is known.
ON_PROC = "/proc/lake/bronze/orders"


def spark_write_failure(cause: JavaThrowable) -> JavaThrowable:
    """What Spark 4.1.3 throws when a task writing a Delta table to ``ON_PROC`` finds no space
    (seen on a full tmpfs): ``TASK_WRITE_FAILED`` naming the table as its ``path`` parameter,
    then Parquet's and Hadoop's wrappers, then the ``IOException`` with the OS's text."""
    return SparkThrowable(
        SPARK,
        f"[TASK_WRITE_FAILED] Task failed while writing rows to file:{ON_PROC}. SQLSTATE: 58030",
        JavaThrowable(
            JavaClass("org.apache.parquet.util.AutoCloseables$ParquetCloseResourceException", IO),
            "Unable to close resource",
            JavaThrowable(FS_ERROR, f"java.io.IOException: {cause.message}", cause),
        ),
        parameters={"path": f"file:{ON_PROC}"},
    )


def test_a_java_full_disk_is_read_with_the_volume_of_the_table_spark_was_writing() -> None:
    failure = spark_write_failure(JavaThrowable(IO, NO_SPACE))
    assert jvm_reason(failure) is StopReason.DISK_FULL
    assert java_disk_full(failure) == VolumeFull(errno.ENOSPC, ON_PROC, "/proc")
    stopped = failure_stop("orders", "orders", StandInPy4JJavaError(failure), None, "Py4J text")
    assert stopped.reason is StopReason.DISK_FULL
    assert stopped.message.startswith(
        f"flow orders failed: disk full on /proc: writing {ON_PROC} failed ({NO_SPACE}); free "
    )
    assert "hard link" not in stopped.message
    quota = spark_write_failure(JavaThrowable(IO, os.strerror(errno.EDQUOT)))
    stopped = failure_stop("orders", "orders", None, quota, "Spark's text")
    assert stopped.reason is StopReason.DISK_FULL
    assert stopped.message.startswith("flow orders failed: quota exceeded on /proc: writing ")


def test_a_java_full_disk_names_a_file_system_exception_s_file_or_says_it_has_no_path() -> None:
    file = FileSystemThrowable(FILE_SYSTEM, f"{ON_PROC}/x: {NO_SPACE}", file=f"{ON_PROC}/x")
    assert java_disk_full(file) == VolumeFull(errno.ENOSPC, f"{ON_PROC}/x", "/proc")
    # A checkpoint write (HDFSMetadataLog): the query's exception names no file at all.
    checkpoint = JavaThrowable(
        STREAMING,
        f"[STREAM_FAILED] Query [id = 1] terminated with exception: java.io.IOException: {NO_SPACE}",
        JavaThrowable(FS_ERROR, f"java.io.IOException: {NO_SPACE}", JavaThrowable(IO, NO_SPACE)),
    )
    full = java_disk_full(checkpoint)
    assert full == VolumeFull(errno.ENOSPC, None, None)
    stopped = failure_stop("orders", "orders", None, checkpoint, "Spark's text")
    assert (stopped.reason, stopped.message) == (
        StopReason.DISK_FULL,
        f"flow orders failed: {full.describe()}",
    )
    assert stopped.message.startswith("flow orders failed: disk full on a volume the error does")
    assert java_disk_full(JavaThrowable(IO, "Connection reset")) is None


def test_a_python_full_disk_is_read_with_the_volume_of_its_file() -> None:
    raw = OSError(errno.ENOSPC, NO_SPACE, f"{ON_PROC}/_status.json")
    assert disk_full(raw) == VolumeFull(errno.ENOSPC, f"{ON_PROC}/_status.json", "/proc")
    try:
        try:
            raise raw
        except OSError as exc:
            raise RuntimeError("writing the heartbeat failed") from exc
    except RuntimeError as wrapped:
        assert disk_full(wrapped) == disk_full(raw)
        stopped = failure_stop("orders", "orders.silver", wrapped, None, "Spark's text")
    assert stopped.reason is StopReason.DISK_FULL
    assert stopped.message.startswith("flow orders.silver failed: disk full on /proc: writing ")
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), f"{ON_PROC}/x")
    full = disk_full(quota)
    assert full is not None and str(DiskFullError(full)).startswith("quota exceeded on /proc: ")
    assert disk_full(OSError(errno.EACCES, "denied", ON_PROC)) is None
    assert disk_full(ValueError("x")) is None

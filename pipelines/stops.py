"""Why a flow stopped, from what stopped it: the type of an exception, never the text of one.

A stop is caused in one of three places, and each knows why:

* a stage raises one of Conflux's errors inside a batch (an expectation, a schema-change policy,
  the transform, a lost lease): :class:`pipelines.progress.BatchFailures` keeps the exception
  object, and :data:`RAISED` maps its type to the reason;
* the runner itself: the lease guard, a stop request, the queries catching up
  (:mod:`pipelines.runner`);
* Spark: a query fails outside Conflux's code (planning a batch from Kafka, a task failing). The
  runner then has the query's Java exception, and :func:`jvm_reason` reads its classes.

A full disk (or a used-up quota) is ``OSError`` with ``errno.ENOSPC`` (``EDQUOT``) on the Python
side; Conflux's own writes raise it as :class:`pipelines.volumes.DiskFullError`, which names the
volume. The JVM has no errno: an ``IOException`` there carries the operating system's text for the
error, which :func:`java_disk_full` compares to ``os.strerror``: the one place a message is read,
and it is the OS's message, not Spark's. The volume comes from what an exception of the chain
names as data (Spark's error parameter ``path``, a ``FileSystemException``'s file), never from
their text: :func:`disk_full` finds both, and the stop's message says ``disk full on <volume>``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from py4j.protocol import Py4JError

from pipelines.errors import ConfigError
from pipelines.lease import LeaseHeldError, LeaseLostError
from pipelines.messages import FlowStopped, StopReason
from pipelines.silver.expectations import ExpectationFailedError
from pipelines.silver.schema_changes import SchemaChangeError
from pipelines.silver.transform import TransformError
from pipelines.volumes import FULL_ERRNOS, VolumeFull, volume_full

#: Conflux's errors by the reason they stop a flow (a subclass before its base class).
RAISED: tuple[tuple[type[BaseException], StopReason], ...] = (
    (ExpectationFailedError, StopReason.EXPECTATION_FAILED),
    (SchemaChangeError, StopReason.SCHEMA_CHANGE_REFUSED),
    (TransformError, StopReason.TRANSFORM_FAILED),
    (LeaseLostError, StopReason.LEASE_LOST),
    (LeaseHeldError, StopReason.LEASE_HELD),
    (ConfigError, StopReason.CONFIG_ERROR),
)
#: Java classes whose exceptions (and their subclasses') are the source's failures: the Kafka
#: client's (a deleted topic, an unreachable broker, authentication) and Spark's Kafka source's
#: own (data loss: offsets gone from the topic).
SOURCE_FAILURES = frozenset(
    {
        "org.apache.kafka.common.KafkaException",
        "org.apache.spark.sql.kafka010.KafkaIllegalStateException",
    }
)
_IO_EXCEPTION = "java.io.IOException"
#: A Java exception about one file, which ``getFile()`` names.
_FILE_SYSTEM_EXCEPTION = "java.nio.file.FileSystemException"
#: The parameter of Spark's error conditions that names the table or file being written
#: (``TASK_WRITE_FAILED``: "Task failed while writing rows to <path>").
_SPARK_PATH_PARAMETER = "path"
#: How many causes deep an exception chain is followed (chains are short; a cycle is not).
_MAX_DEPTH = 32


def python_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < _MAX_DEPTH:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def conflux_error(exc: BaseException | None) -> BaseException | None:
    """The outermost of Conflux's own errors in ``exc``'s chain (a ``pipelines`` module's)."""
    return next((e for e in python_chain(exc) if type(e).__module__.startswith("pipelines.")), None)


def java_exception(exc: BaseException) -> Any | None:
    """The Java throwable behind a Spark error raised in Python: Py4J's ``java_exception``, or
    the origin PySpark keeps in the error it converted it to (no public accessor)."""
    for current in python_chain(exc):
        throwable = getattr(current, "java_exception", None) or getattr(current, "_origin", None)
        if throwable is not None:
            return throwable
    return None


def stop_reason(exc: BaseException) -> StopReason:
    """Why ``exc`` stops a flow: Conflux's error by its type, a full disk, the source's failure
    inside Spark (:func:`jvm_reason`); anything else is a crash."""
    for current in python_chain(exc):
        for kind, reason in RAISED:
            if isinstance(current, kind):
                return reason
    if any(isinstance(e, OSError) and e.errno in FULL_ERRNOS for e in python_chain(exc)):
        return StopReason.DISK_FULL
    throwable = java_exception(exc)
    return (jvm_reason(throwable) if throwable is not None else None) or StopReason.CRASH


def disk_full(exc: BaseException | None, query_error: Any = None) -> VolumeFull | None:
    """The full volume that failed ``exc`` (an ``OSError`` along its chain, else the Java
    exception behind it) or, without one, the query's Java exception ``query_error``; None:
    neither is a full disk."""
    for current in python_chain(exc):
        if isinstance(current, OSError) and (full := volume_full(current)) is not None:
            return full
    throwable = java_exception(exc) if exc is not None else None
    for candidate in (throwable, query_error):
        if candidate is not None and (full := java_disk_full(candidate)) is not None:
            return full
    return None


def _java_chain(throwable: Any) -> Iterator[Any]:
    for _ in range(_MAX_DEPTH):
        if throwable is None:
            return
        yield throwable
        throwable = throwable.getCause()  # null, not itself, at the end (Throwable's contract)


def _java_classes(throwable: Any) -> set[str]:
    """The names of the throwable's class and of every class it extends."""
    names: set[str] = set()
    cls = throwable.getClass()
    while cls is not None:
        names.add(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


def _full_errno(throwable: Any, classes: set[str]) -> int | None:
    """ENOSPC or EDQUOT if ``throwable`` is an ``IOException`` with the OS's text for one."""
    if _IO_EXCEPTION not in classes:
        return None
    message = str(throwable.getMessage() or "")
    return next((number for number in FULL_ERRNOS if os.strerror(number) in message), None)


def _java_path(throwable: Any, classes: set[str]) -> str | None:
    """The file or table ``throwable`` names as data: a ``FileSystemException``'s file, or the
    ``path`` parameter of a Spark error condition (a ``SparkThrowable``'s)."""
    if _FILE_SYSTEM_EXCEPTION in classes:
        file = throwable.getFile()
        return str(file) if file else None
    try:
        parameters = throwable.getMessageParameters()
    except (Py4JError, AttributeError):  # not a SparkThrowable: it has no such method
        return None
    path = parameters.get(_SPARK_PATH_PARAMETER) if parameters else None
    return str(path) if path else None


def java_disk_full(throwable: Any) -> VolumeFull | None:
    """The full volume behind a Java exception: an ``IOException`` along its chain of causes
    with the OS's text for ENOSPC or EDQUOT, on the volume of the first path an exception of
    the chain names (Spark's table being written, a file); None: not a full disk."""
    path: str | None = None
    try:
        for current in _java_chain(throwable):
            classes = _java_classes(current)
            path = path or _java_path(current, classes)
            number = _full_errno(current, classes)
            if number is not None:
                return VolumeFull.at(number, path)
    except Py4JError:  # the JVM is gone: no more to learn
        return None
    return None


def jvm_reason(throwable: Any) -> StopReason | None:
    """Why a Java exception (a query's failure in Spark, or behind a Python one) stopped a flow:
    a full disk or the source, by the classes along its chain of causes; None: neither."""
    try:
        for current in _java_chain(throwable):
            classes = _java_classes(current)
            if _full_errno(current, classes) is not None:
                return StopReason.DISK_FULL
            if classes & SOURCE_FAILURES:
                return StopReason.SOURCE_ERROR
    except Py4JError:  # the JVM is gone: no more to learn
        return None
    return None


def source_failure(raised: BaseException | None, query_error: Any) -> str | None:
    """The source's own exception behind a failure (the innermost of the source's classes along
    the Java chain: the most specific), as ``class: message``; None if there is none."""
    throwable = (java_exception(raised) if raised is not None else None) or query_error
    found = None
    try:
        for current in _java_chain(throwable):
            if _java_classes(current) & SOURCE_FAILURES:
                found = f"{current.getClass().getName()}: {current.getMessage() or ''}".strip()
    except Py4JError:  # the JVM is gone: what was found so far
        pass
    return found


def query_exception(query: Any) -> Any | None:
    """The Java exception a Spark streaming query failed with (None: none, or not Spark's)."""
    jsq = getattr(query, "_jsq", None)
    if jsq is None:
        return None
    try:
        failed = jsq.exception()
        return failed.get() if failed.isDefined() else None
    except Py4JError:
        return None


def failure_stop(
    flow: str, query: str, raised: BaseException | None, query_error: Any, spark_error: str
) -> FlowStopped:
    """How the failure of ``flow``'s ``query`` is reported.

    ``raised``: what its batch raised (:class:`pipelines.progress.BatchFailures`), else
    ``query_error``: the query's Java exception. The message a user reads is a Conflux error's
    own (``Type: message``, all its lines) instead of the Py4J traceback and the query's plan
    around it; a full disk's names the volume (``disk full on /data: ...``); anything else as
    Spark reported it; a source's failure starts with the Kafka client's own exception (``class:
    message``), which the Py4J traceback around it hides.
    """
    if raised is not None:
        reason = stop_reason(raised)
    else:
        reason = (jvm_reason(query_error) if query_error is not None else None) or StopReason.CRASH
    own = conflux_error(raised)
    text = f"{type(own).__name__}: {own}" if own is not None else spark_error
    full = disk_full(raised, query_error) if reason is StopReason.DISK_FULL else None
    if full is not None:
        text = full.describe()
    source = source_failure(raised, query_error) if reason is StopReason.SOURCE_ERROR else None
    if source is not None and not text.startswith(source):  # its first line says what failed
        text = f"{source}\n{text}"
    names = own.names if isinstance(own, ExpectationFailedError) else ()
    return FlowStopped(flow, reason, f"flow {query} failed: {text}", query, names)

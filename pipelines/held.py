"""A micro-batch's intermediate frames, computed once and held, with their lineage cut.

A batch stage reads one intermediate frame (the parsed batch, the reduced rows a MERGE applies)
several times: counts, appends, MERGEs. ``persist()`` alone is not enough for that. Spark reuses
a cached frame only where a later plan still matches it, and Delta's MERGE plans its source anew
inside the command: measured in a silver batch (bench/HISTORY.md, "Silver's batch path"), the
MERGE recomputed the whole parse from the Kafka rows instead of reading the cache, and the
optimizer, pushing the "is an event" filter down through the parser's projections, inlined
every reference to the parsed JSON into one condition with ~4,500 ``from_json`` calls per row
(~9,000 in the history MERGE): 10 ms of CPU per record, 20-40 s for a batch of a few thousand.

:func:`hold` computes a frame once into the executors' block stores (memory, spilling to disk)
and returns a frame that reads those blocks: its plan is a scan of them, so nothing a later
command does can recompute or re-inline what came before. It is what Delta's MERGE does to its
own source (``merge.materializeSource``), done once per batch for all the frame's readers.
:func:`release` frees the blocks as soon as the batch is done with them, rather than when the
driver's garbage collector happens to find them.

The price of the cut lineage: if an executor holding blocks is lost (on a cluster: its JVM or
its host dies), they cannot be recomputed, and the batch's next read of them fails. The batch's
own input still can be (the source's offsets or the Delta versions the batch read), and every
write is idempotent under the batch id, so :func:`run_batch` runs the batch again in place, as a
replay after a crash would, instead of failing the query (a flow run outside Dagster has nothing
that would restart it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from py4j.java_gateway import is_instance_of
from pyspark import SparkContext
from pyspark.sql import DataFrame

#: Spark's error condition when a task reads a held block that is gone with its executor.
LOST_BLOCK = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"
#: Times a batch runs again after losing held blocks; more losses in a row fail the query.
LOST_BLOCK_RETRIES = 2
_CHAIN_LIMIT = 32  # causes followed, in Python and in the JVM (a cycle must not hang a batch)


def hold(frame: DataFrame) -> DataFrame:
    """``frame`` computed now, once; the returned frame reads the held rows (see module doc)."""
    return frame.localCheckpoint(eager=True)


def release(frame: DataFrame | None) -> None:
    """Free the blocks of a frame :func:`hold` returned; None is ignored.

    Give it only frames :func:`hold` returned: any frame whose plan is a scan of an RDD (one made
    by ``createDataFrame`` from an RDD, or a ``foreachBatch`` batch) would have that RDD
    unpersisted too. Safe to call twice; a frame still read afterwards fails (its rows are gone),
    so release only in the ``finally`` of the batch that held it. The blocks are removed in the
    background.
    """
    if frame is None:
        return
    plan = frame._jdf.queryExecution().logical()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def run_batch(write: Callable[[], None], what: str, retries: int = LOST_BLOCK_RETRIES) -> None:
    """``write()`` (one query's batch), run again up to ``retries`` times while it fails only
    because held blocks were lost with an executor (:func:`lost_with_an_executor`); any other
    failure, or one loss too many, is raised as it came, noting the losses before it.

    Only on a cluster: in local mode the driver is the only executor and cannot lose one, so a
    missing block there is a bug (a held frame read after :func:`release`) and fails at once."""
    losses = 0
    for attempt in range(retries + 1):
        try:
            write()
            return
        except Exception as exc:
            if losses:
                exc.add_note(f"conflux: {what} had lost held rows with an executor {losses} "
                             "time(s) before this attempt")  # fmt: skip
            if attempt == retries or _in_local_mode() or not _lost_or_unknown(exc):
                raise
            losses += 1
            print(
                f"conflux: {what}: an executor holding the batch's intermediate rows was lost "
                f"(Spark: {LOST_BLOCK}); running the batch again from its input (attempt "
                f"{attempt + 2} of {retries + 1}): writes already made are skipped by their "
                "transaction ids",
                file=sys.stderr,
                flush=True,
            )


def _in_local_mode() -> bool:
    context = SparkContext._active_spark_context
    return context is None or str(context.master).startswith("local")


def _lost_or_unknown(exc: BaseException) -> bool:
    """:func:`lost_with_an_executor`, False when the question itself fails (a gateway going
    down, an exception of an unexpected shape): that must never replace the batch's own
    exception with its own."""
    try:
        return lost_with_an_executor(exc)
    except Exception:
        return False


def lost_with_an_executor(exc: BaseException) -> bool:
    """Whether Spark's condition :data:`LOST_BLOCK` is on ``exc`` or on anything that caused it:
    the Python chain (``__cause__`` / ``__context__``) and each Java exception behind it (a
    PySpark captured exception's origin, a Py4J error's Java exception) with its causes."""
    python: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if python is None:
            return False
        java = getattr(python, "_origin", None) or getattr(python, "java_exception", None)
        if java is not None and _has_condition(java, LOST_BLOCK):
            return True
        python = python.__cause__ or python.__context__
    return False


def _has_condition(throwable: object, condition: str) -> bool:
    gateway = SparkContext._gateway
    if gateway is None:
        return False
    current: object | None = throwable
    for _ in range(_CHAIN_LIMIT):
        if current is None:
            return False
        spark_error = is_instance_of(gateway, current, "org.apache.spark.SparkThrowable")
        if spark_error and current.getCondition() == condition:  # type: ignore[attr-defined]
            return True
        current = current.getCause()  # type: ignore[attr-defined]
    return False

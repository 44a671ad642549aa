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

The price of the cut lineage: if an executor holding blocks is lost, they cannot be recomputed;
the batch fails and the query replays it (every write is idempotent under the batch id).
"""

from __future__ import annotations

from pyspark.sql import DataFrame


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

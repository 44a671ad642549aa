"""``hand_written`` of ``silver_latency``: the minimal CDC job a user writes by hand, as a floor.

Kafka → ``foreachBatch`` → one Delta MERGE into the current-state table, nothing else: Debezium's
JSON parsed with ``from_json``, the batch reduced to the latest change of each key, then
``MERGE … ON id`` (a delete deletes; an older change never overwrites a newer row, though one
delivered again after its key's delete would bring the key back: no deleted-keys table). It runs
with Conflux's own Spark settings (:func:`pipelines.spark.get_spark_session`). Its table has
Delta's default properties: no change data feed and no deletion vectors (Conflux's current table
has both, deletion vectors used only once the table outgrows a threshold), and Delta's own
checkpoint inside every tenth commit (Conflux's are written in the background).

What it leaves out is what Conflux's batch does besides that MERGE: no bronze table, no parsed
events or quarantine table, no transaction ids (a batch replayed after a crash is merged again:
this job is *not* exactly-once), no lease, no expectations, no progress reporting beyond one line
per batch. So its freshness is what Spark and Delta cost on this machine for the MERGE alone: a
floor for any design whose batch MERGEs into a Delta current-state table.

Three flags add Conflux's own writes one at a time, to see what each costs beside the floor:
``--transaction-ids`` (every write carries the batch's id, as Conflux's do), ``--events PATH``
(the parsed changes appended to an events table) and ``--bronze PATH`` (the raw Kafka rows
appended to a bronze table, last). The harness runs it bare (``hand_written``) and with all
three (``hand_written_exactly_once``: Conflux's writes, without the rest of its batch).

Prints ``conflux: started hand_written`` when the query runs (the harness waits for it), a
``conflux.progress {json}`` line per batch (``stage``: ``merge``; the harness reads batch times
from them) and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import sys
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from bench.silver_latency import PROGRESS, SCHEMA_DDL
from pipelines.catalog.lifecycle import ddl_struct
from pipelines.delta_writes import idempotent_session
from pipelines.spark import get_spark_session


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True, help="the current-state table's path")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--interval", default="500 milliseconds", help="the trigger's interval")
    # Conflux's additions one at a time, to see what each costs (bench/HISTORY.md):
    parser.add_argument(
        "--transaction-ids", action="store_true", help="every write carries (app id, batch id)"
    )
    parser.add_argument("--events", help="also append the parsed changes to this Delta table")
    parser.add_argument("--bronze", help="also append the raw Kafka rows to this Delta table, last")
    return parser.parse_args()


def envelope_schema() -> str:
    """Debezium's envelope (``schemas.enable=false``) as ``from_json`` reads it."""
    row = ", ".join(f"{name}: {kind}" for name, kind in _columns())
    return f"before STRUCT<{row}>, after STRUCT<{row}>, op STRING, source STRUCT<lsn: BIGINT>"


@functools.cache
def _columns() -> list[tuple[str, str]]:
    """(name, type) of each column of the produced rows (``SCHEMA_DDL``), the current table's
    columns before ``_sequence``."""
    return [(f.name, f.dataType.simpleString()) for f in ddl_struct(SCHEMA_DDL).fields]


def parsed_changes(batch: DataFrame) -> DataFrame:
    """The batch's change events: the row (``before``'s key for a delete), ``op``, ``_sequence``."""
    event = F.from_json(F.col("value").cast("string"), envelope_schema())
    parsed = batch.select(event.alias("e")).where(F.col("e.op").isin("c", "u", "r", "d"))
    return parsed.select(
        F.coalesce("e.after.id", "e.before.id").alias("id"),
        *(F.col(f"e.after.{name}").alias(name) for name, _ in _columns()[1:]),
        F.col("e.op").alias("op"),
        F.col("e.source.lsn").alias("_sequence"),
    )


def latest_changes(batch: DataFrame) -> DataFrame:
    """One row per key: the batch's latest change of it (``op``, ``_sequence`` and the row)."""
    rows = parsed_changes(batch)
    newest = Window.partitionBy("id").orderBy(F.col("_sequence").desc())
    return rows.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1").drop("_rank")


def write_batch(args: argparse.Namespace, batch: DataFrame, batch_id: int) -> None:
    """The batch's writes: the current table's MERGE, then what ``args`` adds."""
    txn = args.transaction_ids
    if args.events or args.bronze:
        batch = batch.persist()  # read more than once
    try:
        with idempotent_session(batch.sparkSession, "current", batch_id) if txn else nullcontext():
            # the batch's own session: the one whose confs carry the transaction id
            merge_batch(DeltaTable.forPath(batch.sparkSession, args.table), batch)
        if args.events:
            _append(parsed_changes(batch), args.events, batch_id if txn else None)
        if args.bronze:
            _append(batch, args.bronze, batch_id if txn else None)
    finally:
        batch.unpersist()


def _append(frame: DataFrame, path: str, batch_id: int | None) -> None:
    writer = frame.write.format("delta").mode("append")
    if batch_id is not None:
        writer = writer.option("txnAppId", path).option("txnVersion", str(batch_id))
    writer.save(path)


def merge_batch(table: DeltaTable, batch: DataFrame) -> None:
    """MERGE the batch's latest change of each key into the current table."""
    changes = latest_changes(batch)
    values: dict[str, str | Column] = {name: f"s.{name}" for name, _ in _columns()}
    values["_sequence"] = "s._sequence"
    (
        table.alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.op = 'd' AND t._sequence < s._sequence")
        .whenMatchedUpdate("s.op <> 'd' AND t._sequence < s._sequence", values)
        .whenNotMatchedInsert("s.op <> 'd'", values)
        .execute()
    )


class BatchLines(StreamingQueryListener):
    """One ``conflux.progress`` line per batch, in the shape the harness reads."""

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's listener API
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        p = event.progress
        line = {
            "stage": "merge",
            "batch_duration_ms": p.batchDuration,
            "input_rows": p.numInputRows,
        }
        print(PROGRESS + json.dumps(line), flush=True)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def main() -> int:
    args = parse_args()
    spark: SparkSession = get_spark_session("bench-hand-written-cdc", ui=False)
    schema = ddl_struct(f"{SCHEMA_DDL}, _sequence BIGINT")
    DeltaTable.createIfNotExists(spark).location(args.table).addColumns(schema).execute()
    spark.streams.addListener(BatchLines())
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(lambda batch, batch_id: write_batch(args, batch, batch_id))
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=args.interval)
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("conflux: started hand_written", flush=True)
    while not stop.wait(0.5):
        if not query.isActive:
            query.awaitTermination()  # raises the query's error
            return 1
    query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

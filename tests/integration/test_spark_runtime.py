"""The runtime's foundations on the real engines: Delta on Spark, and Spark reading Kafka."""

from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.held import hold, lost_with_an_executor, release
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker


class TestDeltaOnSpark:
    def test_two_commits_time_travel_and_history(self, spark: SparkSession, tmp_path: Path) -> None:
        path = str(tmp_path / "events")
        spark.range(0, 5).withColumn("v", F.lit("first")).write.format("delta").save(path)
        spark.range(5, 12).withColumn("v", F.lit("second")).write.format("delta").mode(
            "append"
        ).save(path)

        assert spark.read.format("delta").load(path).count() == 12
        version_zero = spark.read.format("delta").option("versionAsOf", 0).load(path)
        assert sorted(r.id for r in version_zero.collect()) == [0, 1, 2, 3, 4]

        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
        assert [(r.version, r.operation) for r in history] == [(0, "WRITE"), (1, "WRITE")]
        assert history[1].operationParameters["mode"] == "Append"


class TestHeldFrames:
    def test_a_held_frame_is_computed_once_even_as_a_merge_source_and_released(
        self, spark: SparkSession, tmp_path: Path
    ) -> None:
        """What pipelines.held promises: the frame's function runs once per row however many
        readers follow (a count, an append, a Delta MERGE that plans its source anew), and its
        blocks go when released."""
        calls = spark.sparkContext.accumulator(0)

        def counted(value: int) -> int:
            calls.add(1)
            return value

        path = str(tmp_path / "target")
        spark.range(0, 10).withColumn("v", F.lit(0)).write.format("delta").save(path)
        stored = {info.id() for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}
        held = hold(spark.range(0, 20).withColumn("v", F.udf(counted, "long")("id")))
        assert calls.value == 20
        holding = {i.id() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()} - stored
        assert holding, "the held rows are in the block stores"
        assert held.where("v >= 0").count() == 20
        held.write.format("delta").mode("append").save(str(tmp_path / "copy"))
        (
            DeltaTable.forPath(spark, path).alias("t")
            .merge(held.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(set={"v": "s.v"})
            .whenNotMatchedInsert(values={"id": "s.id", "v": "s.v"})
            .execute()
        )  # fmt: skip
        assert calls.value == 20, "a reader recomputed the held frame"
        assert spark.read.format("delta").load(path).count() == 20
        release(held)
        release(held)  # twice: nothing
        release(None)
        left = {i.id() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()}
        assert not holding & left, (
            "release unregistered the held rows (blocks go in the background)"
        )


class TestSparkReadsKafka:
    def test_batch_read_of_a_topic_through_the_connector(
        self, spark: SparkSession, kafka_broker: KafkaBroker
    ) -> None:
        topic = "spark_reads_kafka"
        create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
        records = order_payloads(500)
        produce(kafka_broker.bootstrap_servers, topic, records)

        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        rows = frame.select("key", "value", "partition").collect()
        assert sorted((bytes(r.key), bytes(r.value)) for r in rows) == sorted(records)
        assert {r.partition for r in rows} == {0, 1}


def test_a_held_frame_whose_blocks_are_gone_fails_with_the_condition_run_batch_retries(
    spark: SparkSession,
) -> None:
    """What a batch sees when an executor holding its held rows died (pipelines/held.py): here
    the blocks are removed by hand, since in local mode no executor can die. The real Spark
    exception carries the condition where :func:`lost_with_an_executor` looks for it."""
    frame = hold(spark.range(100).repartition(2))
    frame._jdf.queryExecution().logical().rdd().unpersist(True)  # blocking: the blocks are gone
    with pytest.raises(Exception) as raised:
        frame.count()
    assert lost_with_an_executor(raised.value), raised.value
    assert not lost_with_an_executor(ValueError("unrelated"))

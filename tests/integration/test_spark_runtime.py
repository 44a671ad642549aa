"""The runtime's foundations on the real engines: Delta on Spark, and Spark reading Kafka."""

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

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

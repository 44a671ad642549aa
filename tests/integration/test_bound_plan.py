"""The parse planned once and each batch run through that plan (``pipelines/silver/bound_plan.py``)
gives the rows that planning each batch gives: on the shared Spark session, no Kafka, Debezium
change events with every hostile record class mixed in, judged by the schema policy and two
expectations as the stage does, over several batches of different sizes."""

from __future__ import annotations

import datetime as dt
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.held import hold, release
from pipelines.silver.bound_plan import BoundPlan
from pipelines.silver.expectations import FAILED, with_expectations
from pipelines.silver.parse import parse_batch, with_batch_id
from pipelines.silver.schema_changes import with_record_fields
from pipelines.silver.steps import FrameSteps
from pipelines.spec import SilverSpec, parse_spec
from tests.support.cdc import SCHEMA_DDL, bad_records, delivery_order, generate_events, mix_in

BRONZE = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "kafka_timestamp TIMESTAMP"
)


def spec_silver() -> SilverSpec:
    spec = parse_spec(
        {
            "name": "bound",
            "source": {"kind": "kafka", "topics": ["bound"]},
            "target": {"table": "bronze_bound"},
            "silver": {
                "format": "debezium",
                "schema": SCHEMA_DDL,
                "current": {"table": "bound_current", "keys": ["id"]},
                "expectations": [
                    {
                        "name": "known_tier",
                        "rule": "values_in_set",
                        "args": {"column": "tier", "values": ["free", "silver", "gold"]},
                        "action": "drop",
                    },
                    {"name": "email_has_at", "expr": "email LIKE '%_@_%'"},
                ],
            },
        },
        where="test_bound_plan",
    )
    assert spec.silver is not None
    return spec.silver


def batches(spark: SparkSession) -> list[DataFrame]:
    """Three batches of bronze rows, as the fused batch hands them over (a persisted projection
    that stamps ``ingested_at`` with the clock), every hostile record class in the second."""
    stream = [e.record() for e in delivery_order(generate_events(60, seed=3), seed=3)]
    stream = mix_in(stream, [r.record() for r in bad_records()], seed=3)
    cuts = [(0, 5), (5, len(stream) // 2), (len(stream) // 2, len(stream))]
    now = dt.datetime(2026, 11, 29, 12, 0)
    frames = []
    for first, last in cuts:
        rows = [(k, v, "bound", 0, offset, now) for offset, (k, v) in
                enumerate(stream[first:last], start=first)]  # fmt: skip
        frame = spark.createDataFrame(rows, BRONZE).withColumn("ingested_at", F.current_timestamp())
        # the template batch in one partition, the others in three: a batch's own partitioning
        frame = frame.coalesce(1) if first == 0 else frame.repartition(3)
        frames.append(frame.persist())
        time.sleep(0.01)  # each batch its own clock
    return frames


def test_each_batch_bound_to_the_first_ones_plan_parses_as_planned(spark: SparkSession) -> None:
    silver = spec_silver()

    def parse_and_judge(frame: DataFrame) -> DataFrame:  # as SilverStage._parse_steps
        judged = with_record_fields(parse_batch(frame, silver, 0), silver)
        return with_expectations(judged, silver.expectations)

    steps = FrameSteps.record(parse_and_judge)
    bound = BoundPlan(steps.apply)
    ingested = []
    frames = batches(spark)
    try:
        for batch_id, frame in enumerate(frames):
            planned = hold(with_batch_id(steps.apply(frame), batch_id))
            rows = hold(frame) if batch_id == 2 else frame  # held rows: bound as they are
            by_template = hold(with_batch_id(bound.apply(rows), batch_id))
            try:
                assert bound.bindable(frame), "the parse's physical plan is a chain over a scan"
                assert by_template.rdd.getNumPartitions() == frame.rdd.getNumPartitions()
                assert by_template.schema == planned.schema
                assert planned.count() == by_template.count() == frame.count()
                assert planned.exceptAll(by_template).count() == 0, batch_id
                assert by_template.exceptAll(planned).count() == 0, batch_id
                assert {r[0] for r in by_template.select("_batch_id").distinct().collect()} == {
                    batch_id
                }
                stamps = {r[0] for r in by_template.select("_ingested_at").distinct().collect()}
                assert stamps == {r[0] for r in frame.select("ingested_at").distinct().collect()}
                ingested.append(stamps)
                if batch_id == 1:  # hostile records and failed expectations, judged alike
                    assert by_template.where(F.size("_reasons") > 0).count() > 0
                    assert by_template.where(F.size(FAILED) > 0).count() > 0
            finally:
                release(planned)
                release(by_template)
                release(rows if rows is not frame else None)
    finally:
        for frame in frames:
            frame.unpersist()
    # each batch's own clock, never the template batch's
    assert len({min(s) for s in ingested}) == len(ingested), ingested


def test_a_parse_that_reads_a_clock_is_planned_for_every_batch(spark: SparkSession) -> None:
    """A spec's SQL may read the clock (``current_date()`` in ``delete_when``): Spark fixes its
    value when it optimises a plan, so a template would keep the first batch's date for ever."""
    silver = spec_silver()
    bound = BoundPlan(lambda frame: parse_batch(frame, silver, 0).withColumn("d", F.current_date()))
    frames = batches(spark)
    try:
        bound.apply(frames[0])
        assert not bound.bindable(frames[0])
    finally:
        for frame in frames:
            frame.unpersist()

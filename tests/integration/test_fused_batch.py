"""Silver fused into bronze's batch (``chaining: bronze_batch``): exactly once when the application
dies after silver's commits and before bronze's.

In a fused batch the silver tables commit first and bronze's append last
(:meth:`pipelines.stages.bronze.BronzeStage.write_with`), so a kill can leave a batch in every
silver table and not yet in bronze. The test aims there: it pauses the application's process
group the moment the history table (a batch's last silver write) gets a MERGE whose transaction
names a batch that bronze's Delta log does not hold yet, and SIGKILLs it (helpers in
:mod:`tests.support.chaos`). The run after it replays that batch with the offsets its log
recorded: bronze appends it once; the events append and the current table's MERGE are skipped by
their transaction ids, and the history, recomputed, has nothing left to write. Then bronze holds
every Kafka record exactly once, every transaction of bronze, the events, current and history
tables is in one commit, and the silver tables equal the model of :mod:`tests.support.cdc` (the
stream of ``test_silver``: shuffled, partly delivered twice, with records silver must quarantine).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.catalog.state import FlowState
from pipelines.runner import EXIT_OK
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import Launches, write_spec
from tests.integration.test_silver import (
    CDC_SEED,
    PARTITIONS,
    CdcStream,
    SilverPaths,
    check_current_state,
    check_events,
    check_history,
    check_quarantine,
    kill_after_merge_commit,
    silver_flow,
)
from tests.support.cdc import produce_cdc
from tests.support.chaos import AFTER_DELTA_COMMIT, Aim, FlowFiles
from tests.support.delta_read import delta_table
from tests.support.runtime import KafkaBroker

#: Keys of the stream (2,525 records with the default seed) and records per bronze batch: six
#: batches, each a chance to land in the window (bronze's append, ~0.5-1 s).
KEYS = 600
MAX_OFFSETS_PER_TRIGGER = 450


def fused_flow(name: str, topic: str, trigger: dict[str, str], **source: object) -> dict:
    """``test_silver``'s flow (events, quarantine, current and history tables), with silver
    fused into bronze's batch."""
    flow = silver_flow(name, topic, trigger, **source)
    flow["silver"]["chaining"] = "bronze_batch"
    return flow


def test_kill_after_silver_commits_appends_bronze_once(
    spark: SparkSession, spark_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    stream = CdcStream.make(KEYS, CDC_SEED)
    topic = "fused_kill_customers"
    sent = stream.kafka_records()
    produce_cdc(kafka_broker.bootstrap_servers, topic, sent, PARTITIONS)

    def spec(max_offsets_per_trigger: int) -> FlowSpec:
        trigger = {"mode": "continuous", "interval": "1 second"}
        flow = fused_flow(
            "fused_kill", topic, trigger, max_offsets_per_trigger=max_offsets_per_trigger
        )
        return load_spec(write_spec(tmp_path / "flows", flow))

    killed_spec = spec(MAX_OFFSETS_PER_TRIGGER)
    settings = replace(
        spark_settings, spark_conf={"spark.ui.enabled": "false", **spark_settings.spark_conf}
    )
    paths = SilverPaths.of(killed_spec, settings)
    bronze = FlowFiles.of(killed_spec, settings)
    history = FlowFiles(paths.history, bronze.checkpoint)  # one query: bronze's checkpoint
    launches = Launches(killed_spec, settings, tmp_path)

    # pause at each new MERGE of the history table; kill when bronze has no commit of its batch
    in_silver_only = Aim(AFTER_DELTA_COMMIT)
    with launches.run("killed", "continuous") as (group, _out):
        batch = kill_after_merge_commit(
            group, history, in_silver_only, pending=lambda b: not bronze.delta_commits_of_batch(b)
        ).batch_id
    assert not bronze.delta_commits_of_batch(batch) and not bronze.batch_committed(batch)
    tables = [FlowFiles(table, bronze.checkpoint) for table in (paths.events, paths.current)]
    assert all(files.delta_commits_of_batch(batch) for files in tables)

    finished, out = launches.catch_up_here(spark, spec(len(sent)))
    assert finished.code == EXIT_OK, out.tail()
    print(f"\nkilled batch {batch} ({in_silver_only.rate()}); runs: {launches.timings}")

    replayed = {p["stage"]: p for p in out.progress() if p["batch_id"] == batch}
    assert replayed["bronze"]["replayed"] is False, replayed  # appended now, once
    assert replayed["bronze"]["rows_added"] > 0, replayed
    silver_writes = {w["role"]: w for w in replayed["silver"]["writes"]}
    assert silver_writes["current"]["skipped"] is True, replayed["silver"]
    assert silver_writes["events"]["skipped"] is True, replayed["silver"]
    assert "history" not in silver_writes, replayed["silver"]  # the recompute found it written

    for files in (bronze, history, *tables):
        twice = {k: v for k, v in files.txn_commits().items() if len(v) != 1}
        assert not twice, f"{files.table}: transactions in more than one commit: {twice}"
    landed = delta_table(FlowState.of(killed_spec, settings).table).to_pyarrow_table(
        columns=["partition", "offset"]
    )
    offsets = Counter(
        zip(landed["partition"].to_pylist(), landed["offset"].to_pylist(), strict=True)
    )
    assert len(offsets) == len(sent) and set(offsets.values()) == {1}, (len(offsets), len(sent))
    check_current_state(paths, stream)
    check_history(paths, stream)
    check_events(paths, stream)
    check_quarantine(paths, stream)


pytestmark = pytest.mark.timeout(1200)

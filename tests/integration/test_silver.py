"""Silver equals the change log: a Debezium stream delivered out of order and partly twice, and a
silver stage killed in the middle of its MERGE batches, still give the current-state table the
reference model computes (:func:`tests.support.cdc.expected_current_state`).

The stream (:mod:`tests.support.cdc`): inserts, updates, deletes and re-creates of customers, each
with a strictly increasing ``source.lsn``, every record moved up to 50 positions and 5% delivered
twice, each key in one Kafka partition (so one key's events really arrive out of lsn order), plus
one record of each kind silver must quarantine. The flow: bronze, then silver as a query of its
own (``chaining: stream``, query ``<flow>.silver``, checkpoint ``<checkpoints>/<flow>/silver``)
writing the events table, the quarantine and the current-state table (keyed by ``id``, sequenced by
``_source_lsn``), all under ``<lake>/silver/``. delta-rs reads the tables, independently of Spark.

1. :func:`test_silver_current_state_equals_model_under_chaos`: one ``available_now`` run over the
   whole stream; the current table equals the model, the events table holds every change event
   once however often it was delivered, the quarantine every bad record with its reason.
2. :func:`test_kill_during_merge_batches_replays_nothing`: the application is SIGKILLed in a
   silver batch after its MERGE committed and before the batch's commit-log entry (the window
   exactly-once depends on; helpers in :mod:`tests.support.chaos` pause the process group and
   read the frozen files before each kill); ``make chaos`` adds a kill mid-batch in the next
   application, then one more in the first window after that kill's replay (in the suite, a
   silver batch with history is killed mid-batch by :mod:`tests.integration.test_debezium_source`,
   on the local disk; on the store, the zombie test freezes a bronze batch). After a final
   ``available_now`` run the tables still equal the model, and the Delta log of the current
   table holds every transaction ``(appId, version)`` in exactly one MERGE commit: the replays
   were skipped.

The kill test keeps its tables and checkpoints on the module's S3 store in the suite (the same
Spark, Delta and kill windows as on a local disk, plus Conflux's conditional-write log store and
checkpoint manager, and every Delta commit and offset / commit-log file is checked to carry a
writer id), and runs on both the local disk and the store under ``make chaos``.

Scale from the environment: ``SILVER_CHAOS_KEYS`` (default 1,000: 4,192 records, hundreds of
stale, duplicate, re-created and deleted-at-the-end keys in its one batch; ``make chaos``:
10,000) for the first test. For the second: ``SILVER_KILL_KEYS`` (default 600: 2,525 records,
produced in three tranches, one before each killed run under ``make chaos``, so every run has
fresh batches to kill in; in the suite the second and third feed the catch-up);
``SILVER_MAX_OFFSETS_PER_TRIGGER`` (450, under ``make chaos`` 400: a suite tranche is two bronze
batches of three files, one per partition); ``SILVER_MAX_FILES_PER_TRIGGER`` (1: one bronze file
per silver batch in the killed runs, so a tranche alone holds six small silver batches, one for
each pause a kill may spend; 0, the default under ``make chaos``: silver takes what bronze has).
The final catch-up takes the rest in large batches. ``CDC_SEED`` fixes the stream, ``KILL_SEED``
replays a kill schedule.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.reporting import Reporter
from pipelines.runner import EXIT_OK, StopRequest, run_flows
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, load_spec
from tests.integration.test_bronze_exactly_once import Launches, write_spec
from tests.support.cdc import (
    COLUMNS,
    SCHEMA_DDL,
    ChangeEvent,
    bad_records,
    delivered_changes,
    delivery_order,
    expected_current_state,
    expected_history,
    generate_events,
    mix_in,
    produce_cdc,
    records,
    typed_row,
)
from tests.support.chaos import (
    AFTER_DELTA_COMMIT,
    FULL_SCHEDULE,
    MID_BATCH,
    POLL_SECONDS,
    Aim,
    ChaosError,
    FinishedRun,
    FlowFiles,
    Landing,
    ProcessGroup,
    RunOutput,
    kill_mid_batch,
    seed_from_env,
)
from tests.support.delta_read import delta_table, read_rows
from tests.support.runtime import KafkaBroker
from tests.support.tables import silver_path

CHAOS_KEYS = int(os.environ.get("SILVER_CHAOS_KEYS", "1000"))
KILL_KEYS = int(os.environ.get("SILVER_KILL_KEYS", "600"))
MAX_OFFSETS_PER_TRIGGER = int(
    os.environ.get("SILVER_MAX_OFFSETS_PER_TRIGGER", "400" if FULL_SCHEDULE else "450")
)
#: Bronze files per silver batch in the killed runs (0: Delta's default). Small silver batches
#: reach each kill sooner, and each pause that misses its window finds another batch to try.
MAX_FILES_PER_TRIGGER = int(
    os.environ.get("SILVER_MAX_FILES_PER_TRIGGER", "0" if FULL_SCHEDULE else "1")
)
CDC_SEED = int(os.environ.get("CDC_SEED", "20260101"))
PARTITIONS = 3
#: Pauses allowed to aim for a window before the test gives up (each pause costs one batch).
TRIES = 6
STAGE = "silver"
#: The history table's tracked columns: an update of ``name`` alone opens no version.
TRACKED = ("email", "tier")
#: Where the kill test runs (see the module doc).
KILL_LAKES = ("local", "store") if FULL_SCHEDULE else ("store",)
#: How often the kills look at the files on the S3 store, where each look is a listing request
#: (~15 ms, ~6 ms of CPU between the test and the store: at the local disk's 2 ms the watching
#: kept a third of a core busy beside the application it watches, 20 s of CPU in a run). The
#: window after a MERGE (its commit, then the batch's commit-log entry on the store) lasted 80-100
#: ms, so a look every 20 ms still pauses inside it (a miss costs a batch: ``TRIES``); a mid-batch
#: kill aims at a whole batch, seconds long, and waits a random delay into it anyway.
STORE_POLL_SECONDS = {AFTER_DELTA_COMMIT: 0.02, MID_BATCH: 0.1}


@pytest.fixture(params=KILL_LAKES)
def kill_lake(request: pytest.FixtureRequest, spark_settings: Settings) -> tuple[str, Settings]:
    """(``local`` or ``store``, the settings whose lake and checkpoints are there)."""
    if request.param == "local":
        return request.param, spark_settings
    return request.param, request.getfixturevalue("store_settings")


# --- the flow and its stream ------------------------------------------------------------------


@dataclass(frozen=True)
class CdcStream:
    """What was sent: the change events in commit order, as delivered, and the bad records."""

    events: list[ChangeEvent]
    delivered: list[ChangeEvent]
    bad: list[Any]  # tests.support.cdc.BadRecord

    @classmethod
    def make(cls, keys: int, seed: int) -> CdcStream:
        events = generate_events(keys, seed)
        return cls(events, delivery_order(events, seed), bad_records())

    def kafka_records(self) -> list[tuple[bytes | None, bytes | None]]:
        return mix_in(records(self.delivered), [b.record() for b in self.bad], CDC_SEED)

    def winners(self) -> dict[int, ChangeEvent]:
        """Per key, the change event with the highest lsn (what decides the current row)."""
        best: dict[int, ChangeEvent] = {}
        for event in self.events:
            if not event.tombstone and (event.id not in best or event.lsn > best[event.id].lsn):
                best[event.id] = event
        return best


def silver_flow(name: str, topic: str, trigger: dict[str, str], **source: object) -> dict:
    """A Kafka flow with a Debezium silver stage of its own query and a current-state table."""
    return {
        "name": name,
        "source": {"kind": "kafka", "topics": [topic], **source},
        "target": {"table": f"bronze_{name}"},
        "trigger": trigger,
        "silver": {
            "format": "debezium",
            "schema": SCHEMA_DDL,
            "chaining": "stream",
            "events": {"table": f"{name}_events"},
            "quarantine": {"table": f"{name}_quarantine"},
            "current": {"table": f"{name}_customers", "keys": ["id"], "sequence_by": "_source_lsn"},
            # name changes alone update a version in place
            "history": {"table": f"{name}_history", "track_history": list(TRACKED)},
        },
    }


@dataclass(frozen=True)
class SilverPaths:
    """Where a flow's silver stage keeps its tables and its checkpoint."""

    events: Location
    quarantine: Location
    current: Location
    history: Location
    checkpoint: Location
    current_table: str
    history_table: str

    @classmethod
    def of(cls, spec: FlowSpec, settings: Settings) -> SilverPaths:
        silver = spec.silver
        assert silver is not None and silver.current is not None and silver.history is not None
        return cls(
            events=silver_path(settings, silver.events.table),
            quarantine=silver_path(settings, silver.quarantine.table),
            current=silver_path(settings, silver.current.table),
            history=silver_path(settings, silver.history.table),
            checkpoint=FlowState.of(spec, settings).stage_checkpoint(STAGE),
            current_table=silver.current.table,
            history_table=silver.history.table,
        )

    @property
    def deleted_keys(self) -> Location:
        return self.current.parent / f"{self.current.name}__deleted_keys"

    def merge_files(self) -> FlowFiles:
        """The current table's Delta log against the silver checkpoint's offset and commit logs."""
        return FlowFiles(self.current, self.checkpoint)

    def events_files(self) -> FlowFiles:
        return FlowFiles(self.events, self.checkpoint)

    def history_files(self) -> FlowFiles:
        """The history table's Delta log: its MERGE is a batch's last write."""
        return FlowFiles(self.history, self.checkpoint)


def rows(path: Location, columns: list[str]) -> list[dict[str, Any]]:
    """The table's rows as read by delta-rs (its QueryBuilder: deletion vectors)."""
    return read_rows(path, columns)


# --- what the tables must hold ----------------------------------------------------------------


def check_current_state(paths: SilverPaths, stream: CdcStream) -> None:
    """The current table equals the model, row for row, and remembers the deletes that won."""
    expected = {
        key: typed_row(row) for key, row in expected_current_state(stream.delivered).items()
    }
    assert expected == {
        key: typed_row(row) for key, row in expected_current_state(stream.events).items()
    }
    table = rows(paths.current, [*COLUMNS, "_sequence", "_op"])
    ids = Counter(r["id"] for r in table)
    assert not [k for k, n in ids.items() if n > 1], "one row per key"
    got = {r["id"]: {c: r[c] for c in COLUMNS} for r in table}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(expected) & set(got) if got[k] != expected[k])
    assert not (missing or extra or wrong), (
        f"current table vs model: {len(missing)} keys missing {missing[:10]}, {len(extra)} extra "
        f"{extra[:10]}, {len(wrong)} differ, e.g. "
        + "; ".join(f"{k}: got {got[k]} expected {expected[k]}" for k in wrong[:3])
    )
    winners = stream.winners()
    for row in table:
        winner = winners[row["id"]]
        assert (row["_sequence"], row["_op"]) == (winner.lsn, winner.op), row
    deleted_at_end = {key for key, event in winners.items() if event.op == "d"}
    assert deleted_at_end, "the stream ends with some keys deleted"
    remembered = {r["id"] for r in rows(paths.deleted_keys, ["id"])}
    assert deleted_at_end <= remembered, sorted(deleted_at_end - remembered)[:10]


def check_history(paths: SilverPaths, stream: CdcStream) -> None:
    """Per key, the history table's versions, in order, are the model's; one open version per
    live key, none for a deleted one."""
    expected = {
        key: [{**typed_row({c: v[c] for c in COLUMNS}), **_interval(v)} for v in versions]
        for key, versions in expected_history(stream.delivered, TRACKED).items()
    }
    assert expected == {
        key: [{**typed_row({c: v[c] for c in COLUMNS}), **_interval(v)} for v in versions]
        for key, versions in expected_history(stream.events, TRACKED).items()
    }
    got: dict[int, list[dict[str, Any]]] = {}
    table = rows(paths.history, [*COLUMNS, "_valid_from", "_valid_to", "_is_current"])
    for row in sorted(table, key=lambda r: (r["id"], r["_valid_from"])):
        got.setdefault(row["id"], []).append(row)
    wrong = sorted(k for k in set(expected) | set(got) if got.get(k) != expected.get(k))
    assert not wrong, f"{len(wrong)} keys' histories differ from the model, e.g. " + "; ".join(
        f"{k}: got {got.get(k)} expected {expected.get(k)}" for k in wrong[:2]
    )
    in_place = sum(len(v) for v in expected.values())
    assert in_place < sum(1 for e in stream.events if e.op in ("c", "r", "u")), (
        "some updates changed only untracked columns and opened no version"
    )
    live = set(expected_current_state(stream.events))
    open_versions = Counter(r["id"] for r in table if r["_is_current"])
    assert set(open_versions) == live and set(open_versions.values()) == {1}
    assert all(r["_is_current"] == (r["_valid_to"] is None) for r in table)


def _interval(version: dict[str, Any]) -> dict[str, Any]:
    return {
        "_valid_from": version["_valid_from"],
        "_valid_to": version["_valid_to"],
        "_is_current": version["_valid_to"] is None,
    }


def check_events(paths: SilverPaths, stream: CdcStream) -> None:
    """Every change event once, however often it was delivered (a change is its key, op and
    position: pipelines/silver/changes.py), no tombstone."""
    table = rows(paths.events, ["id", "_op", "_sequence", "_source_lsn", "_event_date"])
    assert delivered_changes(stream.delivered) > len(table), "some changes were delivered twice"
    landed = Counter((r["id"], r["_op"], r["_source_lsn"]) for r in table)
    sent = Counter({(e.id, e.op, e.lsn): 1 for e in stream.delivered if not e.tombstone})
    assert landed == sent, (
        f"missing {list((sent - landed).items())[:5]}, extra {list((landed - sent).items())[:5]}"
    )
    assert all(r["_sequence"] == r["_source_lsn"] for r in table)
    assert all(r["_event_date"] is not None for r in table)


def check_quarantine(paths: SilverPaths, stream: CdcStream) -> None:
    """Each bad record once, its bytes kept, with the reason it deserves."""
    table = rows(paths.quarantine, ["raw_key", "raw_value", "reasons", "topic", "offset"])
    assert len(table) == len(stream.bad), [r["reasons"] for r in table]
    for bad in stream.bad:
        found = [r for r in table if r["raw_value"] == bad.value]
        assert len(found) == 1, (bad.name, len(found))
        assert found[0]["raw_key"] == bad.key, bad.name
        reasons = found[0]["reasons"]
        assert any(bad.reason in reason for reason in reasons), (bad.name, bad.reason, reasons)


def check_single_merge_per_txn(
    paths: SilverPaths, history: bool = False
) -> dict[tuple[str, int], list[int]]:
    """Every txn (appId, version) of the current (or history) table in exactly one commit, and
    that a MERGE."""
    files = paths.history_files() if history else paths.merge_files()
    table_name = paths.history_table if history else paths.current_table
    txn_commits = files.txn_commits()
    assert txn_commits, f"{table_name} has no commit with a transaction id"
    twice = {key: versions for key, versions in txn_commits.items() if len(versions) != 1}
    assert not twice, f"transaction versions committed more than once: {twice}"
    apps = {app for app, _version in txn_commits}
    assert len(apps) == 1, sorted(apps)
    (app,) = apps
    assert app.startswith("conflux-") and app.endswith(table_name), app
    for (_app, _batch), (version,) in txn_commits.items():
        assert commit_operation(files, version) == "MERGE", version
    committed = set(files.committed_batches())
    assert {batch for _app, batch in txn_commits} <= committed
    return txn_commits


def check_silver_tables(paths: SilverPaths, stream: CdcStream) -> None:
    """Every silver table equals the model, each batch's MERGEs committed once."""
    check_current_state(paths, stream)
    check_history(paths, stream)
    check_events(paths, stream)
    check_quarantine(paths, stream)
    check_single_merge_per_txn(paths)
    check_single_merge_per_txn(paths, history=True)


# --- killing a MERGE batch --------------------------------------------------------------------


def commit_operation(files: FlowFiles, version: int) -> str | None:
    """The ``commitInfo.operation`` of table version ``version``."""
    for action in files.delta_commit(version):
        if "commitInfo" in action:
            return str(action["commitInfo"].get("operation"))
    return None


def kill_after_merge_commit(
    group: ProcessGroup,
    files: FlowFiles,
    aim: Aim,
    tries: int = TRIES,
    timeout: float = 600.0,
    poll: float = POLL_SECONDS,
    pending: Callable[[int], bool] | None = None,
) -> Landing:
    """SIGKILL after a silver batch's MERGE into the aimed table committed, before the batch's
    entry in the silver commit log (or, given ``pending``, while ``pending(B)`` holds).

    Like :func:`tests.support.chaos.kill_after_delta_commit`, on that table's Delta log and
    the silver checkpoint: the moment a new table version appears the group is paused; if that
    version is a MERGE whose ``txn`` names batch ``B`` and ``commits/B`` is absent, the pause
    landed in the window: kill. Else resume and wait for the next version, at most ``tries`` times.
    ``poll``: how often the Delta log is looked at (on an object store each look is a request).
    """
    waiting = pending or (lambda batch: not files.batch_committed(batch))
    seen = max(files.latest_delta_version(), 0)
    deadline = time.monotonic() + timeout
    for attempt in range(1, tries + 1):
        while files.latest_delta_version() <= seen:
            if not group.running():
                raise ChaosError(f"the application exited ({group.exit_code()}) before a MERGE")
            if time.monotonic() > deadline:
                raise ChaosError(f"timed out waiting for a MERGE after v{seen}")
            time.sleep(poll)
        group.pause()
        try:
            aim.pauses += 1
            version = files.latest_delta_version()
            txn = files.delta_txn(version)
            merged = commit_operation(files, version) == "MERGE"
            if merged and txn is not None and waiting(txn[1]):
                group.kill()
                aim.hits += 1
                return Landing(AFTER_DELTA_COMMIT, txn[1], AFTER_DELTA_COMMIT, attempt)
            aim.misses.append(files.where())
        finally:
            if group.running():
                group.resume()
        seen = version
    raise ChaosError(f"no pause landed after a MERGE commit in {tries} tries ({aim.rate()})")


def silver_progress(out: RunOutput, batch_id: int) -> dict[str, Any] | None:
    """The silver stage's progress payload of ``batch_id`` (bronze reports the same ids too)."""
    return next(
        (p for p in out.progress() if p.get("stage") == STAGE and p["batch_id"] == batch_id),
        None,
    )


def wait_silver_batch(
    group: ProcessGroup | FinishedRun, out: RunOutput, batch_id: int, timeout: float = 600.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (progress := silver_progress(out, batch_id)) is None:
        if not group.running():
            progress = silver_progress(out, batch_id)
            if progress is not None:
                return progress
            raise ChaosError(f"the run exited before silver batch {batch_id}\n{out.tail()}")
        if time.monotonic() > deadline:
            raise ChaosError(f"silver batch {batch_id} not reported in {timeout:.0f} s")
        time.sleep(0.1)
    return progress


def check_silver_restart(
    landing: Landing, paths: SilverPaths, group: ProcessGroup | FinishedRun, out: RunOutput
) -> None:
    """What the run after ``landing`` (aimed at the history table's MERGE) must show for the
    killed silver batch."""
    files, batch = paths.history_files(), landing.batch_id
    progress = wait_silver_batch(group, out, batch)
    writes = {w["role"]: w for w in progress["writes"]}
    if landing.kind == AFTER_DELTA_COMMIT:
        # Replayed: every write came before the history MERGE, so Delta skips them; the history
        # recomputed from the events equals what the MERGE committed: nothing to write.
        for role in ("events", "quarantine", "current", "deleted_keys", "history"):
            assert writes.get(role, {"skipped": True})["skipped"] is True, progress
        assert "history" not in writes, progress
    elif landing.kind == MID_BATCH and "history" in writes:
        assert writes["history"]["skipped"] is False, progress
    else:
        return
    assert len(files.delta_commits_of_batch(batch)) <= 1, (landing, files.txn_commits())
    deadline = time.monotonic() + 60  # the commit-log entry follows the batch's writes
    while not files.batch_committed(batch):
        assert time.monotonic() < deadline, f"silver batch {batch} never reached the commit log"
        time.sleep(0.1)


# --- the tests --------------------------------------------------------------------------------


class TestSilverCurrentState:
    def test_silver_current_state_equals_model_under_chaos(
        self,
        spark: SparkSession,
        spark_settings: Settings,
        kafka_broker: KafkaBroker,
        tmp_path: Path,
    ) -> None:
        stream = CdcStream.make(CHAOS_KEYS, CDC_SEED)
        topic = "silver_chaos_customers"
        sent = stream.kafka_records()
        produce_cdc(kafka_broker.bootstrap_servers, topic, sent, PARTITIONS)
        spec = load_spec(
            write_spec(
                tmp_path / "flows",
                silver_flow("silver_chaos", topic, {"mode": "available_now"}),
            )
        )
        code = run_flows(
            [spec], spark_settings, Reporter(), StopRequest(None), "available_now", spark=spark
        )
        assert code == EXIT_OK

        bronze = delta_table(FlowState.of(spec, spark_settings).table)
        assert bronze.to_pyarrow_table(columns=["offset"]).num_rows == len(sent)
        paths = SilverPaths.of(spec, spark_settings)
        # One available_now run carries silver to the end of what bronze ingested in that run.
        check_silver_tables(paths, stream)


class TestSilverExactlyOnce:
    def test_kill_during_merge_batches_replays_nothing(
        self,
        spark: SparkSession,
        kill_lake: tuple[str, Settings],
        kafka_broker: KafkaBroker,
        tmp_path: Path,
    ) -> None:
        lake, lake_settings = kill_lake
        seed = seed_from_env()
        print(f"\nkill schedule seed: KILL_SEED={seed}  CDC_SEED={CDC_SEED}")
        rng = random.Random(seed)
        stream = CdcStream.make(KILL_KEYS, CDC_SEED)
        topic = f"silver_kill_customers_{lake}"
        # Each killed run gets a fresh tranche of the stream, so it has silver batches of its own
        # to kill in however far the run before it got (bronze may ingest a whole tranche before
        # silver's first batch, and silver without a file limit may then take it in one batch).
        sent = stream.kafka_records()
        tranches = [sent[i * len(sent) // 3 : (i + 1) * len(sent) // 3] for i in range(3)]

        def produce_tranche(index: int) -> None:
            produce_cdc(
                kafka_broker.bootstrap_servers,
                topic,
                tranches[index],
                PARTITIONS,
                create=index == 0,
            )

        def kill_spec(max_offsets_per_trigger: int, max_files_per_trigger: int) -> FlowSpec:
            flow = silver_flow(
                "silver_kill",
                topic,
                {"mode": "continuous", "interval": "1 second"},
                max_offsets_per_trigger=max_offsets_per_trigger,
            )
            if max_files_per_trigger:
                flow["silver"]["max_files_per_trigger"] = max_files_per_trigger
            return load_spec(write_spec(tmp_path / "flows", flow))

        spec = kill_spec(MAX_OFFSETS_PER_TRIGGER, MAX_FILES_PER_TRIGGER)
        settings = replace(
            lake_settings, spark_conf={"spark.ui.enabled": "false", **lake_settings.spark_conf}
        )
        paths = SilverPaths.of(spec, settings)
        files = paths.history_files()  # the last MERGE of a batch: every write is before it
        launches = Launches(spec, settings, tmp_path)
        window, mid_batch = Aim(AFTER_DELTA_COMMIT), Aim(MID_BATCH)
        landings: list[Landing] = []
        polls = {k: STORE_POLL_SECONDS[k] if lake == "store" else POLL_SECONDS
                 for k in (AFTER_DELTA_COMMIT, MID_BATCH)}  # fmt: skip

        def report() -> None:
            print(f"kills landed: {[(k.kind, k.batch_id) for k in landings]}")
            for aim in (window, mid_batch):
                print(f"  {aim.rate()}; misses (where the pause found silver): {aim.misses}")
            print(f"  runs (name, seconds): {launches.timings}  KILL_SEED={seed}")

        try:
            produce_tranche(0)
            with launches.run("run-0", "continuous") as (group, out):
                landings.append(
                    kill_after_merge_commit(group, files, window, poll=polls[AFTER_DELTA_COMMIT])
                )
            produce_tranche(1)
            if FULL_SCHEDULE:  # the suite's mid-batch kill of a silver batch: test_debezium_source
                with launches.run("run-1", "continuous") as (group, out):
                    check_silver_restart(landings[-1], paths, group, out)
                    delay = lambda: rng.uniform(0.0, 1.0)  # noqa: E731  (batches last seconds)
                    replayed = landings[-1].batch_id  # aim at the first batch after the replay
                    landings.append(
                        kill_mid_batch(
                            group,
                            files,
                            mid_batch,
                            delay,
                            TRIES,
                            after=replayed,
                            poll=polls[MID_BATCH],
                        )
                    )
            produce_tranche(2)
            if FULL_SCHEDULE:
                with launches.run("run-2", "continuous") as (group, out):
                    check_silver_restart(landings[-1], paths, group, out)
                    landings.append(
                        kill_after_merge_commit(
                            group, files, window, poll=polls[AFTER_DELTA_COMMIT]
                        )
                    )
            # the rest in large batches: the killed batch first, with the offsets it planned
            finished, out = launches.catch_up_here(spark, kill_spec(len(sent), 0))
            assert finished.code == EXIT_OK, out.tail()
            check_silver_restart(landings[-1], paths, finished, out)
        except ChaosError:
            report()
            raise
        report()

        more = [MID_BATCH, AFTER_DELTA_COMMIT] if FULL_SCHEDULE else []
        assert [k.kind for k in landings] == [AFTER_DELTA_COMMIT, *more]
        # The replays were skipped: no transaction of the current or history table in two
        # commits, and the killed batches' history MERGE once each.
        check_single_merge_per_txn(paths)
        txn_commits = check_single_merge_per_txn(paths, history=True)
        for landing in landings:
            batches = [v for (_app, b), v in txn_commits.items() if b == landing.batch_id]
            assert len(batches) <= 1, (landing, batches)
            if landing.kind == AFTER_DELTA_COMMIT:
                assert len(batches) == 1, landing
        events_txns = paths.events_files().txn_commits()
        assert not {k: v for k, v in events_txns.items() if len(v) != 1}, events_txns

        check_current_state(paths, stream)
        check_history(paths, stream)
        check_events(paths, stream)
        check_quarantine(paths, stream)
        if lake == "store":  # no file that decides who wins was written by a plain PUT
            for flow_files in (files, paths.merge_files(), FlowFiles.of(spec, settings)):
                assert not flow_files.plain_puts(), flow_files.plain_puts()[:5]
            assert str(paths.current).startswith("s3a://"), paths.current


pytestmark = pytest.mark.timeout(2400)  # 2 shared cores: each Spark start can take minutes

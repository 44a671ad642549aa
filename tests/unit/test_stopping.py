"""A graceful stop waits for the batch running now, and never for one that will not run.

The fake query replays the statuses and progresses Spark 4.1 reports (recorded with a file source
and a 2 s trigger): a trigger that finds no data records a progress under the id of the *next*
batch with no ``addBatch`` among its durations (the first one after a start at once, then every
10 s), and reads "Waiting for data to arrive" while it is still active.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pipelines import stopping
from pipelines.stopping import (
    batch_may_commit,
    last_batch_id,
    stop_after_inflight_batches,
)

RAN = {"addBatch": 40, "latestOffset": 3, "triggerExecution": 50, "walCommit": 4}
IDLE = {"latestOffset": 2, "triggerExecution": 2}


def progress(batch_id: int, durations: dict[str, int]) -> dict[str, Any]:
    return {"batchId": batch_id, "durationMs": durations}


class FakeQuery:
    """Each read of ``status`` moves to the next scripted step: (status message, trigger active,
    lastProgress after it)."""

    def __init__(
        self,
        steps: list[tuple[str, bool, dict[str, Any] | None]],
        recent: list[dict[str, Any]] | None = None,
    ) -> None:
        self._steps = steps
        self.recentProgress = recent or []
        self._at = 0
        self.isActive = True
        self.stopped_at_step: int | None = None

    @property
    def _step(self) -> tuple[str, bool, dict[str, Any] | None]:
        return self._steps[min(self._at, len(self._steps) - 1)]

    @property
    def status(self) -> dict[str, Any]:
        message, active, _ = self._step
        self._at += 1
        return {"message": message, "isDataAvailable": False, "isTriggerActive": active}

    @property
    def lastProgress(self) -> dict[str, Any] | None:  # noqa: N802 (Spark's name)
        return self._step[2]

    def stop(self) -> None:
        self.stopped_at_step = self._at
        self.isActive = False


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping.time, "sleep", lambda _seconds: None)


def test_the_last_batch_is_the_last_that_ran_not_the_idle_trigger_after_it() -> None:
    assert last_batch_id(FakeQuery([("Waiting for next trigger", False, None)])) == -1
    ran = FakeQuery([("Waiting for next trigger", False, progress(1, RAN))])
    assert last_batch_id(ran) == 1
    idle = FakeQuery(
        [("Waiting for next trigger", False, progress(2, IDLE))],
        recent=[progress(0, RAN), progress(1, RAN), progress(2, IDLE)],
    )
    assert last_batch_id(idle) == 1  # batch 2 never ran


def test_a_query_restarted_from_a_checkpoint_that_ran_nothing_yet_has_no_last_batch() -> None:
    # batches 0-6 ran in an earlier run; this run's first trigger found no data
    restarted = FakeQuery(
        [("Waiting for next trigger", False, progress(7, IDLE))], recent=[progress(7, IDLE)]
    )
    assert last_batch_id(restarted) == -1
    stop_after_inflight_batches([restarted], timeout=5.0)
    assert restarted.stopped_at_step == 1  # nothing in flight: stopped at once


@pytest.mark.parametrize(
    ("message", "active", "may_commit"),
    [
        ("Getting offsets from KafkaV2[Subscribe[orders]]", True, True),
        ("Processing new data", True, True),
        ("No new data but cleaning up state", True, True),
        ("Waiting for data to arrive", True, False),
        ("Waiting for next trigger", False, False),
    ],
)
def test_a_batch_may_commit_only_while_a_trigger_is_still_at_work(
    message: str, active: bool, may_commit: bool
) -> None:
    assert batch_may_commit(FakeQuery([(message, active, None)])) is may_commit


def test_a_stop_while_the_trigger_finds_no_data_does_not_wait_for_a_batch() -> None:
    query = FakeQuery(
        [
            ("Getting offsets from KafkaV2[Subscribe[orders]]", True, progress(2, IDLE)),
            ("Getting offsets from KafkaV2[Subscribe[orders]]", True, progress(2, IDLE)),
            ("Waiting for data to arrive", True, progress(2, IDLE)),
            ("Getting offsets from KafkaV2[Subscribe[orders]]", True, progress(2, IDLE)),
        ]
    )
    started = time.monotonic()
    stop_after_inflight_batches([query], timeout=5.0)
    assert query.stopped_at_step == 3  # at the first "Waiting", not at the timeout
    assert time.monotonic() - started < 1.0


def test_a_stop_during_a_batch_waits_for_its_commit() -> None:
    processing = ("Processing new data", True, progress(1, RAN))
    query = FakeQuery(
        [
            processing,
            processing,
            processing,
            ("Waiting for next trigger", False, progress(2, RAN)),  # batch 2 committed
        ]
    )
    stop_after_inflight_batches([query], timeout=5.0)
    assert query.stopped_at_step == 3  # three statuses at work, then batch 2's progress
    assert last_batch_id(query) == 2


def test_a_stop_between_triggers_stops_at_once() -> None:
    query = FakeQuery([("Waiting for next trigger", False, progress(5, RAN))])
    stop_after_inflight_batches([query], timeout=5.0)
    assert query.stopped_at_step == 1


def test_queries_stop_under_one_deadline_each_after_the_batch_in_flight_when_asked() -> None:
    """The downstream query's batch in flight is noted before the upstream one is waited for:
    a batch it starts meanwhile (on the upstream's commit) is not waited for."""
    upstream = FakeQuery(
        [
            ("Processing new data", True, progress(3, RAN)),
            ("Waiting for next trigger", False, progress(4, RAN)),
        ]
    )
    downstream = FakeQuery(
        [("Waiting for next trigger", False, progress(8, RAN))]
        + [("Processing new data", True, progress(8, RAN))] * 50
    )
    started = time.monotonic()
    stop_after_inflight_batches([upstream, downstream], timeout=5.0)
    assert upstream.stopped_at_step == 1 and downstream.stopped_at_step == 1
    assert time.monotonic() - started < 1.0

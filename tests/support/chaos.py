"""Kill a streaming application at a moment that matters, and prove where the kill landed.

A SIGKILL "at a random moment" rarely lands in the one window exactly-once depends on: after the
batch's Delta commit, before Structured Streaming's commit-log entry. The helpers here watch a
flow's files (the Delta log, the checkpoint's ``offsets/`` and ``commits/``), freeze the whole
application with ``SIGSTOP`` on its process group the moment something happens, read the frozen
state, and only then decide: ``SIGKILL`` if the pause landed where wanted, ``SIGCONT`` and try
again on a later batch otherwise. Because nothing moves between the read and the kill, the
recorded :class:`Landing` is a fact, not a guess.

Where a kill can land, for a batch ``B`` (the highest batch id in ``offsets/``):

* :data:`AFTER_DELTA_COMMIT`: Delta holds a commit with ``txn.version == B``, ``commits/B`` is
  absent. On restart the batch is replayed and Delta must skip it.
* :data:`MID_BATCH`: ``offsets/B`` exists, no Delta commit has ``txn.version == B``, ``commits/B``
  is absent. On restart the batch runs again and is committed once.
* :data:`BETWEEN_BATCHES`: ``commits/B`` exists (the next batch is not planned yet).
* :data:`BEFORE_FIRST_BATCH`: no batch was planned in this checkpoint yet.

The application is expected in a process group of its own (``start_new_session=True``, as
:class:`pipelines.launcher.FlowApplication` does): the ``spark-submit`` JVM leads the group and
the Python driver is its child, so one ``killpg`` reaches both.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.reporting import PROGRESS_PREFIX
from pipelines.settings import Settings
from pipelines.spec import FlowSpec
from pipelines.storage import WRITE_ID

AFTER_DELTA_COMMIT = "after-delta-commit"
MID_BATCH = "mid-batch"
BETWEEN_BATCHES = "between-batches"
BEFORE_FIRST_BATCH = "before-first-batch"

#: How often the watchers look at the flow's folders (the window they aim for lasts ~0.1 s).
POLL_SECONDS = 0.002
#: ``make chaos`` sets ``CHAOS_FULL_SCHEDULE=1``: every kill of each test's schedule (repeats of a
#: window, kills at random moments). The suite kills once in each window a claim rests on (after
#: a Delta commit, before its commit-log entry; mid-batch): each kill costs a Spark application.
FULL_SCHEDULE = os.environ.get("CHAOS_FULL_SCHEDULE") == "1"
_DELTA_COMMIT = re.compile(r"^(\d{20})\.json$")


class ChaosError(AssertionError):
    """The application did not reach the state a kill was waiting for (exited, or timed out)."""


def seed_from_env(variable: str = "KILL_SEED") -> int:
    """The kill schedule's seed: ``$KILL_SEED`` if set, else a fresh random one (print it)."""
    value = os.environ.get(variable)
    return int(value) if value else int.from_bytes(os.urandom(4), "big") >> 2


# --- the flow's files -----------------------------------------------------------------------


def _numbered(folder: Location, pattern: re.Pattern[str] | None = None) -> list[int]:
    """Sorted numbers of the files in ``folder`` named by a number (or matching ``pattern``);
    none if the folder does not exist (yet)."""
    numbers = []
    for name in folder.names():
        if pattern is None:
            if name.isdigit():
                numbers.append(int(name))
        else:
            match = pattern.match(name)
            if match:
                numbers.append(int(match.group(1)))
    return sorted(numbers)


@dataclass(frozen=True)
class FlowFiles:
    """The files of one flow that tell how far a batch got: Delta log, offset log, commit log.

    Read through :class:`~pipelines.location.Location`, so the table and the checkpoint may be on
    the local disk or on an S3 store alike."""

    table: Location
    checkpoint: Location

    @classmethod
    def of(cls, spec: FlowSpec, settings: Settings) -> FlowFiles:
        locations = FlowState.of(spec, settings)
        return cls(locations.table, locations.checkpoint)

    @property
    def delta_log(self) -> Location:
        return self.table / "_delta_log"

    def delta_versions(self) -> list[int]:
        """Versions with a commit file ``_delta_log/%020d.json``, ascending."""
        return _numbered(self.delta_log, _DELTA_COMMIT)

    def latest_delta_version(self) -> int:
        versions = self.delta_versions()
        return versions[-1] if versions else -1

    def delta_commit(self, version: int) -> list[dict[str, Any]]:
        """The actions of commit ``version``: one JSON object per line."""
        commit = self.delta_log / f"{version:020d}.json"
        return [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]

    def delta_txn(self, version: int) -> tuple[str, int] | None:
        """``(appId, version)`` of commit ``version``'s ``txn`` action, or None if it has none."""
        for action in self.delta_commit(version):
            txn = action.get("txn")
            if txn is not None:
                return str(txn["appId"]), int(txn["version"])
        return None

    def txn_commits(self) -> dict[tuple[str, int], list[int]]:
        """Every ``(appId, txn version)`` in the Delta log, with the table versions carrying it."""
        commits: dict[tuple[str, int], list[int]] = {}
        for version in self.delta_versions():
            for action in self.delta_commit(version):
                txn = action.get("txn")
                if txn is not None:
                    key = (str(txn["appId"]), int(txn["version"]))
                    commits.setdefault(key, []).append(version)
        return commits

    def delta_commits_of_batch(self, batch_id: int) -> list[int]:
        """Table versions whose ``txn`` action has version ``batch_id`` (any app id)."""
        return [
            version
            for (_app, txn_version), versions in self.txn_commits().items()
            if txn_version == batch_id
            for version in versions
        ]

    def planned_batches(self) -> list[int]:
        """Batch ids in the checkpoint's offset log (``offsets/<id>``), ascending."""
        return _numbered(self.checkpoint / "offsets")

    def committed_batches(self) -> list[int]:
        """Batch ids in the checkpoint's commit log (``commits/<id>``), ascending."""
        return _numbered(self.checkpoint / "commits")

    def offsets_logged(self, batch_id: int) -> bool:
        return (self.checkpoint / "offsets" / str(batch_id)).exists()

    def batch_committed(self, batch_id: int) -> bool:
        return (self.checkpoint / "commits" / str(batch_id)).exists()

    def plain_puts(self) -> list[str]:
        """Delta commits and offset / commit-log files on S3 that do NOT carry a writer id:
        written by a plain PUT, which could have overwritten a rival's (empty: every one was a
        conditional create). Only for a table and checkpoint on S3."""
        folders = {
            self.delta_log: [f"{v:020d}.json" for v in self.delta_versions()],
            **{
                self.checkpoint / log: [n for n in (self.checkpoint / log).names() if n.isdigit()]
                for log in ("offsets", "commits")
            },
        }
        plain = []
        for folder, names in folders.items():
            client = folder.storage.client  # type: ignore[attr-defined]
            bucket, _, prefix = folder.uri.partition("://")[2].partition("/")
            for name in names:
                head = client.head_object(Bucket=bucket, Key=f"{prefix}/{name}")
                if WRITE_ID not in head.get("Metadata", {}):
                    plain.append(f"{folder}/{name}")
        return plain

    def where(self) -> tuple[str, int]:
        """Where the flow is right now: ``(one of the landing kinds, batch id)``.

        Only exact while the application is paused (or dead): the files keep changing otherwise.
        """
        planned = self.planned_batches()
        if not planned:
            return BEFORE_FIRST_BATCH, -1
        batch = planned[-1]
        if self.batch_committed(batch):
            return BETWEEN_BATCHES, batch
        if self.delta_commits_of_batch(batch):
            return AFTER_DELTA_COMMIT, batch
        return MID_BATCH, batch


# --- the application's process group --------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from ``/proc``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(name))
    return members


class _GroupSignals:
    """Pause, resume and kill every member of the process group ``pgid`` at once."""

    pgid: int

    def pause(self) -> None:
        os.killpg(self.pgid, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGCONT)

    def _kill_members(self, timeout: float, reap: Callable[[], object] = lambda: None) -> None:
        """SIGKILL every member (a crash: no handler, no cleanup); wait until all are gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        reap()
        deadline = time.monotonic() + timeout
        while members := _group_members(self.pgid):
            if time.monotonic() > deadline:
                raise ChaosError(f"process group {self.pgid} still has members {members}")
            time.sleep(0.05)


@dataclass
class ProcessGroup(_GroupSignals):
    """The process group an application this process started leads."""

    process: subprocess.Popen[Any]

    @property
    def pgid(self) -> int:  # type: ignore[override]
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        """The group leader's exit code, None while it runs."""
        return self.process.poll()

    def kill(self, timeout: float = 60.0) -> None:
        self._kill_members(timeout, reap=lambda: self.process.wait(timeout=timeout))


@dataclass(frozen=True)
class ApplicationGroup(_GroupSignals):
    """The process group of an application another process launched (a launcher under Dagster),
    known by its group id alone; its launcher reaps it."""

    pgid: int

    def running(self) -> bool:
        return bool(_group_members(self.pgid))

    def exit_code(self) -> int | None:
        return None  # not this process's child: its exit code is its launcher's to read

    def kill(self, timeout: float = 60.0) -> None:
        self._kill_members(timeout)


#: What the kills can aim at: an application this process started, or one another process did.
Group = ProcessGroup | ApplicationGroup


@dataclass(frozen=True)
class FinishedRun:
    """A run that has already returned (a catch-up in the test's own process), standing where
    the checks take a :class:`ProcessGroup`: it is not running, and exited with ``code``."""

    code: int

    def running(self) -> bool:
        return False

    def exit_code(self) -> int:
        return self.code


# --- kills ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Landing:
    """Where one kill landed: ``kind`` is one of the landing kinds, ``batch_id`` the batch."""

    kind: str
    batch_id: int
    aimed_at: str
    attempts: int = 1

    def __str__(self) -> str:
        return f"({self.kind}, {self.batch_id})"


@dataclass
class Aim:
    """Counts of pauses made while aiming for one window, and how many landed in it."""

    window: str
    pauses: int = 0
    hits: int = 0
    misses: list[tuple[str, int]] = field(default_factory=list)

    def rate(self) -> str:
        return f"{self.window}: {self.hits}/{self.pauses} pauses landed in the window"


@contextlib.contextmanager
def _paused(group: Group) -> Iterator[None]:
    """Freeze the group for the block; it resumes afterwards unless the block killed it."""
    group.pause()
    try:
        yield
    finally:
        if group.running():
            group.resume()


def _wait_until(
    group: Group, ready: Callable[[], bool], deadline: float, what: str, poll: float = POLL_SECONDS
) -> None:
    while not ready():
        if not group.running():
            raise ChaosError(f"the application exited (code {group.exit_code()}) {what}")
        if time.monotonic() > deadline:
            raise ChaosError(f"timed out {what}")
        time.sleep(poll)


def kill_after_delta_commit(
    group: ProcessGroup, files: FlowFiles, aim: Aim, tries: int = 8, timeout: float = 600.0
) -> Landing:
    """SIGKILL between a batch's Delta commit and its commit-log entry.

    Polls ``_delta_log`` every :data:`POLL_SECONDS` for a commit newer than the current one
    (version >= 1: version 0 creates the table). The moment one appears, the group is paused; the
    commit's ``txn`` action names its batch ``B``. ``commits/B`` absent means the pause landed in
    the window: kill. Present means it came too late: resume and wait for the next batch, at most
    ``tries`` times. Raises :class:`ChaosError` if no pause landed in the window.
    """
    seen = max(files.latest_delta_version(), 0)
    deadline = time.monotonic() + timeout
    for attempt in range(1, tries + 1):

        def new_commit(after: int = seen) -> bool:
            return files.latest_delta_version() > after

        _wait_until(group, new_commit, deadline, f"waiting for a Delta commit after v{seen}")
        with _paused(group):
            aim.pauses += 1
            version = files.latest_delta_version()
            txn = files.delta_txn(version)
            if txn is not None and not files.batch_committed(txn[1]):
                group.kill()
                aim.hits += 1
                return Landing(AFTER_DELTA_COMMIT, txn[1], AFTER_DELTA_COMMIT, attempt)
            aim.misses.append(files.where())
        seen = version
    raise ChaosError(f"no pause landed after a Delta commit in {tries} tries ({aim.rate()})")


def kill_mid_batch(
    group: Group,
    files: FlowFiles,
    aim: Aim,
    delay: Callable[[], float],
    tries: int = 8,
    timeout: float = 600.0,
    after: int | None = None,
    strike: Callable[[], None] | None = None,
    poll: float = POLL_SECONDS,
) -> Landing:
    """SIGKILL while a planned batch runs: ``offsets/B`` written, no Delta commit, no ``commits/B``.

    Waits for an entry in the offset log after batch ``after`` (default: the newest planned
    now), then ``delay()`` seconds more (to land inside the batch's Spark jobs rather than at its
    very start), pauses the group and checks the state; kills if it is mid-batch, else resumes
    and tries the next batch, at most ``tries`` times. ``after`` lets a caller aim at a batch
    already planned (the first after a replay) instead of waiting for the one after it.
    ``strike``: what to do instead of killing the group (e.g. kill one of its executors on a
    cluster); the group, paused while it strikes, then resumes inside the batch. ``poll``: how
    often the files are looked at (on an object store each look is a request).
    """
    planned = files.planned_batches()
    seen = after if after is not None else (planned[-1] if planned else -1)
    deadline = time.monotonic() + timeout
    for attempt in range(1, tries + 1):

        def new_batch(after: int = seen) -> bool:
            batches = files.planned_batches()
            return bool(batches) and batches[-1] > after

        _wait_until(group, new_batch, deadline, f"waiting for a batch after {seen}", poll)
        time.sleep(delay())
        with _paused(group):
            aim.pauses += 1
            kind, batch = files.where()
            if kind == MID_BATCH:
                (strike or group.kill)()
                aim.hits += 1
                return Landing(MID_BATCH, batch, MID_BATCH, attempt)
            aim.misses.append((kind, batch))
        seen = batch
    raise ChaosError(f"no pause landed mid-batch in {tries} tries ({aim.rate()})")


def kill_now(group: ProcessGroup, files: FlowFiles, aimed_at: str = "random") -> Landing:
    """Pause the group, record where it is (:meth:`FlowFiles.where`), SIGKILL it."""
    with _paused(group):
        kind, batch = files.where()
        group.kill()
    return Landing(kind, batch, aimed_at)


# --- what the runner reported ---------------------------------------------------------------


@dataclass(frozen=True)
class RunOutput:
    """The stdout / stderr files of one run of the runner (JSON progress lines on stdout)."""

    stdout: Path
    stderr: Path

    def progress(self) -> list[dict[str, Any]]:
        """Every ``conflux.progress`` payload printed so far."""
        if not self.stdout.exists():
            return []
        return [
            json.loads(line[len(PROGRESS_PREFIX) :])
            for line in self.stdout.read_text(errors="replace").splitlines()
            if line.startswith(PROGRESS_PREFIX)
        ]

    def batch(self, batch_id: int) -> dict[str, Any] | None:
        """The progress payload of ``batch_id``, if the run reported it."""
        return next((p for p in self.progress() if p["batch_id"] == batch_id), None)

    def _read(self, path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""

    def text(self) -> str:
        """Everything the run printed, stdout then stderr.

        The runner prints its log lines (``conflux: ...``) to its stderr, but under
        ``spark-submit`` Spark's ``PythonRunner`` merges the Python driver's stderr into its own
        stdout, so they arrive on the application's stdout; search both.
        """
        return self._read(self.stdout) + self._read(self.stderr)

    def tail(self, chars: int = 4000) -> str:
        out, err = self._read(self.stdout), self._read(self.stderr)
        return f"--- stdout\n{out[-chars:]}\n--- stderr\n{err[-chars:]}"

    def wait_for_batch(
        self, group: ProcessGroup | FinishedRun, batch_id: int, timeout: float = 600.0
    ) -> dict[str, Any]:
        """Block until the run reported ``batch_id``; return its progress payload."""
        found: list[dict[str, Any]] = []

        def reported() -> bool:
            payload = self.batch(batch_id)
            if payload is not None:
                found.append(payload)
            return bool(found)

        deadline = time.monotonic() + timeout
        while not reported():
            if not group.running():
                reported()
                if found:
                    break
                raise ChaosError(
                    f"the run exited ({group.exit_code()}) before reporting batch {batch_id}\n"
                    + self.tail()
                )
            if time.monotonic() > deadline:
                raise ChaosError(f"batch {batch_id} not reported in {timeout:.0f} s\n{self.tail()}")
            time.sleep(0.1)
        return found[0]

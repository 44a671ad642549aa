"""Ownership leases: one writer per flow, enforced before Spark starts and before every batch.

Two Spark applications running one flow race on its checkpoint and its table. Spark's offset log
catches the race only where a rename is atomic, and only after both applications have started.
A lease settles it up front: whoever holds a flow's lease may run it; everyone else exits at once,
naming the owner and since when.

Storage: numbered terms, each created once
    A flow's lease lives beside its checkpoint (:attr:`FlowState.lease_dir`) as numbered files
    ``term-0000000001.json``, ``term-0000000002.json``, ... Each file is one *term*: created with a
    conditional create that fails if the file exists (a hard link of a fully written temporary
    file on a POSIX filesystem; ``If-None-Match: *`` is the object-store equivalent), and never
    changed afterwards. The highest term is the lease's state. Renewing means creating the next
    term with the same owner and a later expiry; taking over an expired lease means creating the
    next term with another owner; releasing means creating the next term marked released. Two
    contenders for the same term number cannot both succeed, so the check-then-create is a
    compare-and-swap: the loser re-reads and learns who won.

Who renews
    The *launcher* (the Dagster run worker, ``conflux run``, or the runner itself when it is
    started directly) renews the lease every third of its duration. The Spark application only
    reads it: it checks before each micro-batch, and every half second while it runs, that the
    lease is still its own and will not expire within the safety margin (a third of the duration),
    and that its launcher still lives (on the launcher's host: its pid, in the same pid namespace,
    started when it was), and stops otherwise. So when a launcher dies, its application, now an
    orphan, stops at once (a driver on another host: within one lease period), before the lease
    expires and a new owner can take it over.

Clocks: expiry times are wall-clock seconds written by the renewing host. Across hosts, keep the
clock skew well below the safety margin (NTP keeps it in milliseconds).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from pipelines.errors import ConfigError
from pipelines.processes import exited, stat_fields
from pipelines.storage import LocalStorage, StateStorage, join
from pipelines.timestamps import iso_utc

TERM_PREFIX, TERM_SUFFIX = "term-", ".json"
#: Terms kept below the current one; older ones are deleted (only the newest matters).
TERMS_KEPT = 8
DEFAULT_LEASE_SECONDS = 30.0


def new_owner_id(kind: str) -> str:
    """A unique, file-name-safe owner id such as ``dagster-3f2a9c1b7e4d``."""
    return f"{kind}-{uuid.uuid4().hex[:12]}"


#: Details that tell the owner's process apart (:func:`owner_process_gone`), not shown to people.
_IDENTITY_ONLY = frozenset({"pidns", "started"})


def _start_ticks(pid: int | str) -> str | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22): a
    pid reused by a later process has another; None when unknown."""
    fields = stat_fields(pid)
    return fields[19] if fields else None


@functools.cache
def _pid_namespace() -> str | None:
    """This process's pid namespace (fixed for its life: read once)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owner_details(**extra: str) -> dict[str, str]:
    """Who is asking: host and pid of this process, its pid namespace and start time (so a pid
    seen from another container or reused later is not taken for it), plus ``extra``."""
    details = {"host": socket.gethostname(), "pid": str(os.getpid()), **extra}
    for key, value in (("pidns", _pid_namespace()), ("started", _start_ticks(os.getpid()))):
        if value is not None:
            details[key] = value
    return details


#: ``details["launcher"]`` of a runner that holds its own lease: its Spark driver is that process.
IN_PROCESS_LAUNCHER = "pipelines.runner"


def process_gone(host: str | None, pid: str | int | None) -> bool:
    """Whether ``pid`` was a process on this host that no longer exists or has exited and is not
    yet reaped (a zombie); False if unknown."""
    if host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return exited(pid)  # a zombie renews nothing: gone


def owner_process_gone(term: LeaseTerm) -> bool:
    """Whether the term's owner was a process on this host, in this pid namespace, that no longer
    runs (its pid free, a zombie not yet reaped, or taken by a process started later). False when
    that cannot be known: another host, another pid namespace (a container sharing the host's
    name)."""
    details = term.details
    if details.get("pidns", _pid_namespace()) != _pid_namespace():
        return False
    if process_gone(details.get("host"), details.get("pid")):
        return True
    started, pid = details.get("started"), details.get("pid")
    same_host = details.get("host") == socket.gethostname()
    return bool(same_host and started and pid and _start_ticks(pid) not in (None, started))


def dead_in_process_owner(term: LeaseTerm) -> bool:
    """The owner was a runner holding its own lease, and its process is gone: so is its Spark
    driver, and nothing can write any more. Its lease may be taken over without waiting.

    A dead *launcher* is different: the Spark application it started may still run until it sees
    the lease lapse, so a new owner waits for the expiry (``wait_for_expiry_of``).
    """
    return term.details.get("launcher") == IN_PROCESS_LAUNCHER and owner_process_gone(term)


@dataclass(frozen=True)
class LeaseTerm:
    """One term of a flow's lease: who owns it, since when, until when."""

    flow: str
    term: int
    owner: str
    details: Mapping[str, str]
    acquired_at: float
    renewed_at: float
    expires_at: float
    released: bool = False

    def live(self, now: float | None = None, margin: float = 0.0) -> bool:
        """Held and not expiring within ``margin`` seconds."""
        current = time.time() if now is None else now
        return not self.released and self.expires_at - margin > current

    @property
    def duration(self) -> float:
        return self.expires_at - self.renewed_at

    def describe(self, now: float | None = None) -> str:
        """Who holds it (the details a person reads; not the pid namespace and start time that
        tell the process apart) and since when; held until, expired (how long ago), or
        released."""
        where = ", ".join(
            f"{k} {v}" for k, v in sorted(self.details.items()) if k not in _IDENTITY_ONLY
        )
        held = f"owner {self.owner} ({where}) since {iso_utc(self.acquired_at)}"
        now = time.time() if now is None else now
        if self.released:
            return f"{held}, released"
        if self.expires_at <= now:
            ago = now - self.expires_at
            return f"{held}, expired at {iso_utc(self.expires_at)} ({ago:.0f} s ago)"
        return f"{held}, expires {iso_utc(self.expires_at)}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "details": dict(self.details)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseTerm:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)


class LeaseHeldError(ConfigError):
    """Another owner holds the flow's lease: this launch must not start."""


class LeaseLostError(RuntimeError):
    """This owner no longer holds the flow's lease: its application must stop now."""


class LeaseStore(Protocol):
    """Where a flow's lease terms live; ``create`` must be a conditional create."""

    def latest(self) -> LeaseTerm | None: ...

    def create(self, term: LeaseTerm) -> bool: ...

    def prune(self, below: int) -> None: ...


@dataclass(frozen=True)
class StoredLeaseStore:
    """Lease terms as files ``term-<number>.json`` in folder ``location`` of a
    :class:`~pipelines.storage.StateStorage`: a local folder or an S3 prefix. Creating term N is
    the storage's conditional create, so of two contenders for N exactly one wins, on any host."""

    location: str
    storage: StateStorage

    def _uri(self, term: int) -> str:
        return join(self.location, f"{TERM_PREFIX}{term:010d}{TERM_SUFFIX}")

    def _terms(self) -> list[int]:
        numbers = []
        for name in self.storage.list(self.location):
            if name.startswith(TERM_PREFIX) and name.endswith(TERM_SUFFIX):
                with contextlib.suppress(ValueError):
                    numbers.append(int(name[len(TERM_PREFIX) : -len(TERM_SUFFIX)]))
        return sorted(numbers)

    def latest(self) -> LeaseTerm | None:
        for _attempt in range(5):  # a concurrent prune may delete a file between list and read
            terms = self._terms()
            if not terms:
                return None
            data = self.storage.read(self._uri(terms[-1]))
            if data is not None:
                return LeaseTerm.from_json(data.decode())
        raise ConfigError(
            f"{self.location}: the lease terms keep disappearing; is it being cleaned?"
        )

    def create(self, term: LeaseTerm) -> bool:
        """Write ``term`` unless its number exists: a fully written file appears atomically."""
        if not self.storage.create(self._uri(term.term), term.to_json().encode()):
            return False
        # A contender that read a term long ago may find its successor pruned and create it
        # again: that term is not the newest, so it did not win.
        return self._terms()[-1] == term.term

    def prune(self, below: int) -> None:
        for number in self._terms():
            if number < below:
                self.storage.delete(self._uri(number))


def FileLeaseStore(folder: Path) -> StoredLeaseStore:  # noqa: N802  (reads as the class it was)
    """Lease terms in a folder of a POSIX filesystem (local disk, NFS with hard links)."""
    return StoredLeaseStore(str(folder), LocalStorage())


@dataclass
class FlowLease:
    """This process's claim on one flow: acquire, renew, check, release."""

    flow: str
    store: LeaseStore
    owner: str
    details: Mapping[str, str] = field(default_factory=dict)
    duration: float = DEFAULT_LEASE_SECONDS
    term: LeaseTerm | None = None

    def acquire(
        self,
        wait_for_expiry_of: Callable[[LeaseTerm], bool] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> LeaseTerm:
        """Take the lease, or raise :class:`LeaseHeldError` naming its live owner.

        ``wait_for_expiry_of(term)``, when it returns True for the live owner's term (its owner
        is known to be gone, e.g. a finished Dagster run whose orphaned application is still
        stopping), makes this call wait until that term expires instead of failing. The lease of
        a dead runner that held it for itself is taken over at once (:func:`dead_in_process_owner`).
        """
        while True:
            current = self.store.latest()
            now = clock()
            if (
                current is not None
                and current.live(now)
                and current.owner != self.owner
                and not dead_in_process_owner(current)
            ):
                if wait_for_expiry_of is not None and wait_for_expiry_of(current):
                    time.sleep(min(1.0, max(0.05, current.expires_at - now)))
                    continue
                raise LeaseHeldError(
                    f"flow {self.flow} is already running: its lease is held by "
                    f"{current.describe()}. Wait for that run to end, or stop it "
                    f"(`conflux stop {self.flow}`); a dead owner's lease expires by itself."
                )
            candidate = LeaseTerm(
                flow=self.flow,
                term=(current.term if current else 0) + 1,
                owner=self.owner,
                details=dict(self.details),
                acquired_at=now,
                renewed_at=now,
                expires_at=now + self.duration,
            )
            if self.store.create(candidate):
                self.term = candidate
                self.store.prune(candidate.term - TERMS_KEPT)
                return candidate
            # Someone created this term first: re-read and judge the winner.

    def renew(self, clock: Callable[[], float] = time.time) -> LeaseTerm:
        """Extend the lease by one duration; raise :class:`LeaseLostError` if it is not ours."""
        held = self._held()
        now = clock()
        if not held.live(now):
            raise LeaseLostError(
                f"flow {self.flow}: the lease expired at {iso_utc(held.expires_at)}"
            )
        renewed = replace(held, term=held.term + 1, renewed_at=now, expires_at=now + self.duration)
        if not self.store.create(renewed):
            raise LeaseLostError(f"flow {self.flow}: another owner took the lease")
        self.term = renewed
        self.store.prune(renewed.term - TERMS_KEPT)
        return renewed

    def release(self) -> None:
        """Give the lease up now (best effort: a lost lease has nothing to release)."""
        with contextlib.suppress(LeaseLostError):
            held = self._held()
            now = time.time()
            if self.store.create(
                replace(held, term=held.term + 1, renewed_at=now, expires_at=now, released=True)
            ):
                self.term = None

    def term_still_safe(self) -> bool:
        """Whether this owner's last known term has more than a third of its duration left."""
        return self.term is not None and self.term.live(margin=self.term.duration / 3)

    def _held(self) -> LeaseTerm:
        current = self.store.latest()
        if self.term is None or current is None or current.term != self.term.term:
            owner = current.describe() if current else "nobody"
            raise LeaseLostError(f"flow {self.flow}: the lease is no longer ours; now: {owner}")
        return current


@dataclass
class LeaseGuard:
    """Read-only check, from the Spark application, that ``owner`` still holds a flow's lease,
    and that the launcher renewing it (``details["pid"]``, when on this host) still lives."""

    flow: str
    store: LeaseStore
    owner: str

    def current(self) -> LeaseTerm:
        """The live term held by ``owner``, or raise :class:`LeaseLostError` saying why not."""
        term = self.store.latest()
        if term is None or term.owner != self.owner:
            state = "nobody" if term is None else term.describe()
            if term is not None and not term.live():
                state += " (released)" if term.released else " (expired)"
            raise LeaseLostError(
                f"flow {self.flow}: the lease is no longer {self.owner}'s; its last term: {state}"
            )
        if term.released:
            raise LeaseLostError(f"flow {self.flow}: {self.owner} released the lease")
        if term.details.get("launcher") != IN_PROCESS_LAUNCHER and owner_process_gone(term):
            # Its launcher renews the lease and releases it once the application exits: gone
            # (kill -9, OOM), it does neither, so the application stops now, not at the expiry.
            # Asked before the expiry: a check that comes late (a busy driver) names the cause.
            raise LeaseLostError(
                f"flow {self.flow}: its launcher {self.owner} (pid {term.details.get('pid')} on "
                f"{term.details.get('host')}) is gone: nothing renews the lease"
            )
        if not term.live(margin=term.duration / 3):
            raise LeaseLostError(
                f"flow {self.flow}: the lease of {self.owner} expires at "
                f"{iso_utc(term.expires_at)} and was not renewed (is its launcher gone?)"
            )
        return term

    def check(self) -> None:
        self.current()


class LeaseKeeper:
    """Renews the leases it holds in a daemon thread, every third of their duration, until closed.

    Leases join with :meth:`add` as soon as they are acquired, so a lease taken first keeps being
    renewed while a later one waits. A renewal that fails for a passing reason (an I/O error of
    the lease store) is retried at the next period; a lease found lost is dropped and reported
    once through ``on_lost`` (called from the thread), and the others go on being renewed.
    """

    def __init__(self, period: float, on_lost: Callable[[str], None] | None = None) -> None:
        self.leases: list[FlowLease] = []
        self._lock = threading.Lock()
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(period,), name="conflux-lease-keeper", daemon=True
        )

    def add(self, lease: FlowLease) -> None:
        with self._lock:
            self.leases.append(lease)

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            with self._lock:
                leases = list(self.leases)
            for lease in leases:
                try:
                    lease.renew()
                except LeaseLostError as exc:
                    with self._lock:
                        self.leases.remove(lease)
                    if self._on_lost is not None:
                        self._on_lost(str(exc))
                except (OSError, ValueError, ConfigError) as exc:
                    if self._on_lost is not None and not lease.term_still_safe():
                        self._on_lost(f"flow {lease.flow}: cannot renew the lease: {exc}")

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for lease in self.leases:
                lease.release()


@contextlib.contextmanager
def held_leases(
    leases: list[FlowLease],
    wait_for_expiry_of: Callable[[LeaseTerm], bool] | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Iterator[LeaseKeeper]:
    """Acquire every lease (all or none), keep renewing them, release them on exit."""
    period = min((lease.duration for lease in leases), default=3.0) / 3
    with LeaseKeeper(period, on_lost) as keeper:
        for lease in leases:
            lease.acquire(wait_for_expiry_of)  # on an error, the keeper releases those it holds
            keeper.add(lease)
        yield keeper

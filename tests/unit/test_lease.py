"""Flow leases on a real filesystem: conditional creates, takeover, renewal, loss (no JVM)."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.lease import (
    IN_PROCESS_LAUNCHER,
    FileLeaseStore,
    FlowLease,
    LeaseGuard,
    LeaseHeldError,
    LeaseLostError,
    held_leases,
    owner_details,
    owner_process_gone,
)
from pipelines.processes import stat_fields


def lease(folder: Path, owner: str, duration: float = 30.0) -> FlowLease:
    return FlowLease("orders", FileLeaseStore(folder), owner, {"host": "h", "pid": "1"}, duration)


def test_second_owner_is_refused_with_owner_and_since(tmp_path: Path) -> None:
    lease(tmp_path, "first").acquire()
    with pytest.raises(LeaseHeldError) as error:
        lease(tmp_path, "second").acquire()
    message = str(error.value)
    assert "flow orders is already running" in message
    assert "owner first" in message and "since 20" in message and "conflux stop orders" in message


def test_concurrent_takers_never_both_win(tmp_path: Path) -> None:
    """32 threads race for a free lease, 20 rounds: exactly one winner each time."""
    for round_number in range(20):
        folder = tmp_path / f"round-{round_number}"
        start = threading.Barrier(32)
        winners: list[str] = []

        def take(
            owner: str,
            folder: Path = folder,
            start: threading.Barrier = start,
            winners: list[str] = winners,
        ) -> None:
            start.wait()
            try:
                lease(folder, owner).acquire()
                winners.append(owner)
            except LeaseHeldError:
                pass

        threads = [threading.Thread(target=take, args=(f"o{i}",)) for i in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1
        assert FileLeaseStore(folder).latest().owner == winners[0]


def test_an_expired_lease_is_taken_over_and_the_old_owner_learns_it(tmp_path: Path) -> None:
    old = lease(tmp_path, "old", duration=0.2)
    old.acquire()
    time.sleep(0.3)
    new = lease(tmp_path, "new")
    new.acquire()
    with pytest.raises(LeaseLostError):
        old.renew()
    assert FileLeaseStore(tmp_path).latest().owner == "new"


def test_renewal_extends_and_release_frees(tmp_path: Path) -> None:
    mine = lease(tmp_path, "me", duration=5)
    first = mine.acquire()
    renewed = mine.renew()
    assert renewed.term == first.term + 1 and renewed.expires_at >= first.expires_at
    assert renewed.acquired_at == first.acquired_at
    mine.release()
    assert not FileLeaseStore(tmp_path).latest().live()
    lease(tmp_path, "next").acquire()  # a released lease is free at once


def test_old_terms_are_pruned(tmp_path: Path) -> None:
    mine = lease(tmp_path, "me")
    mine.acquire()
    for _ in range(30):
        mine.renew()
    assert len(list(tmp_path.glob("term-*.json"))) <= 9
    assert FileLeaseStore(tmp_path).latest().term == 31


def test_guard_stops_before_expiry_within_the_safety_margin(tmp_path: Path) -> None:
    mine = lease(tmp_path, "me", duration=3.0)
    mine.acquire()
    guard = LeaseGuard("orders", FileLeaseStore(tmp_path), "me")
    guard.check()
    time.sleep(2.1)  # a third of the duration left: not safe to start another batch
    with pytest.raises(LeaseLostError, match="was not renewed"):
        guard.check()
    with pytest.raises(LeaseLostError, match="no longer someone-else's"):
        LeaseGuard("orders", FileLeaseStore(tmp_path), "someone-else").check()


def test_guard_stops_at_once_when_the_launcher_renewing_the_lease_is_gone(tmp_path: Path) -> None:
    """A launcher killed by SIGKILL renews nothing: its application must not wait for the expiry
    (minutes) to stop. A runner holding its own lease is its own launcher: never gone to itself."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    here = socket.gethostname()
    details = {"host": here, "pid": str(launcher.pid), "launcher": "cli"}
    FlowLease("orders", FileLeaseStore(tmp_path), "cli-1", details, 300.0).acquire()
    guard = LeaseGuard("orders", FileLeaseStore(tmp_path), "cli-1")
    guard.check()  # the launcher lives
    launcher.kill()
    launcher.wait()
    with pytest.raises(LeaseLostError, match=rf"its launcher cli-1 \(pid {launcher.pid} on "):
        guard.check()
    in_process = {"host": here, "pid": str(launcher.pid), "launcher": IN_PROCESS_LAUNCHER}
    FlowLease("own", FileLeaseStore(tmp_path / "own"), "runner-1", in_process, 300.0).acquire()
    LeaseGuard("own", FileLeaseStore(tmp_path / "own"), "runner-1").check()


def test_a_killed_launcher_not_yet_reaped_is_gone_and_named_past_the_margin(
    tmp_path: Path,
) -> None:
    """A launcher killed with its parent stays a zombie until init reaps it: it still answers
    kill(pid, 0) but renews nothing, so it is gone. A guard that checks late (a busy driver, the
    lease past its margin) names that cause, rather than only the missed renewal that the margin
    check reports."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        details = {"host": socket.gethostname(), "pid": str(launcher.pid), "launcher": "cli"}
        FlowLease("orders", FileLeaseStore(tmp_path), "cli-1", details, 3.0).acquire()
        guard = LeaseGuard("orders", FileLeaseStore(tmp_path), "cli-1")
        guard.check()
        launcher.kill()  # not waited for: a zombie, as under a parent killed at the same time
        deadline = time.monotonic() + 5
        while (fields := stat_fields(launcher.pid)) is None or fields[0] != "Z":
            assert time.monotonic() < deadline, f"the killed launcher stays as {fields}"
            time.sleep(0.01)
        time.sleep(2.1)  # a third of the duration left: past the guard's margin
        with pytest.raises(LeaseLostError, match=r"its launcher cli-1 .* is gone"):
            guard.check()
    finally:
        launcher.kill()
        launcher.wait()


def test_keeper_renews_while_held_and_releases_on_exit(tmp_path: Path) -> None:
    mine = lease(tmp_path, "me", duration=0.6)
    with held_leases([mine]):
        time.sleep(1.5)  # several durations: only renewals keep it
        LeaseGuard("orders", FileLeaseStore(tmp_path), "me").check()
    assert not FileLeaseStore(tmp_path).latest().live()


def test_waiting_for_a_dead_owner_takes_over_at_expiry(tmp_path: Path) -> None:
    lease(tmp_path, "dead", duration=1.0).acquire()
    started = time.monotonic()
    lease(tmp_path, "next").acquire(wait_for_expiry_of=lambda term: term.owner == "dead")
    assert 0.5 < time.monotonic() - started < 3


def test_a_dead_runner_that_held_its_own_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    no_such_pid = "999999999"  # above the kernel's pid_max: never a live process
    details = {"host": socket.gethostname(), "pid": no_such_pid, "launcher": IN_PROCESS_LAUNCHER}
    FlowLease("orders", FileLeaseStore(tmp_path), "runner-dead", details).acquire()
    started = time.monotonic()
    lease(tmp_path, "next").acquire()
    assert time.monotonic() - started < 1
    # A dead launcher's lease is not: its Spark application may still run until it lapses.
    launcher = {**details, "launcher": "cli"}
    FlowLease("other", FileLeaseStore(tmp_path / "o"), "cli-dead", launcher).acquire()
    with pytest.raises(LeaseHeldError):
        lease(tmp_path / "o", "next").acquire()


def test_a_reused_pid_is_gone_and_a_pid_of_another_namespace_is_unknown(tmp_path: Path) -> None:
    """The launcher's pid alone is not its identity: a later process may reuse it (its start
    time differs: gone), and a container sharing the host's name has its own pids (unknown:
    not gone, the lease's expiry decides)."""
    me = owner_details()
    FlowLease("a", FileLeaseStore(tmp_path / "a"), "cli-1", me, 300.0).acquire()
    assert not owner_process_gone(FileLeaseStore(tmp_path / "a").latest())
    reused = {**me, "started": "1"}  # this pid, but a process started at boot
    FlowLease("b", FileLeaseStore(tmp_path / "b"), "cli-2", reused, 300.0).acquire()
    assert owner_process_gone(FileLeaseStore(tmp_path / "b").latest())
    elsewhere = {**me, "pid": "999999999", "pidns": "pid:[1]"}
    FlowLease("c", FileLeaseStore(tmp_path / "c"), "cli-3", elsewhere, 300.0).acquire()
    assert not owner_process_gone(FileLeaseStore(tmp_path / "c").latest())

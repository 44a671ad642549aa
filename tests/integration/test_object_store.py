"""Flow-state storage on a real S3-compatible server (the project's s3proxy, ``platform/s3/store.py``)
and on the local disk, held to the same contract: atomic replace, create-if-absent with exactly one
winner among racing creators (each with its own client, as separate hosts would be), listing,
deleting; a flow lease on the store; the store manager's restarts keep port, credentials and data.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.lease import FlowLease, LeaseHeldError, StoredLeaseStore
from pipelines.storage import LocalStorage, S3Storage, StateStorage
from tests.support.runtime import S3_STORE_SCRIPT, S3Store, ServiceCli

RACERS, ROUNDS = 16, 5


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Callable[[], StateStorage], str]:
    """A factory of storage clients (one per racer) and a fresh folder URI on it."""
    if request.param == "local":
        return LocalStorage, str(tmp_path / "state")
    s3: S3Store = request.getfixturevalue("s3_store")
    return (lambda: S3Storage(s3.connection)), f"s3a://{s3.bucket}/{tmp_path.name}"


def test_the_storage_contract(store: tuple[Callable[[], StateStorage], str]) -> None:
    make, folder = store
    storage = make()
    first, second = f"{folder}/a.json", f"{folder}/b.json"
    assert storage.read(first) is None and storage.list(folder) == []
    assert storage.create(first, b"one") is True
    assert storage.create(first, b"two") is False  # exists: left as it was
    assert storage.read(first) == b"one"
    storage.write(first, b"three")  # replaces
    storage.write(second, b"x")
    assert storage.read(first) == b"three"
    assert storage.list(folder) == ["a.json", "b.json"]
    storage.delete(second)
    storage.delete(second)  # already gone: nothing
    assert storage.list(folder) == ["a.json"]
    assert storage.create(second, b"again") is True


def test_folders_exist_move_and_go_as_a_whole(
    store: tuple[Callable[[], StateStorage], str],
) -> None:
    """What a reset does to a checkpoint: move it into the archive, later delete the archive. A
    sibling whose name starts like the folder's is not part of it."""
    make, folder = store
    storage = make()
    checkpoint, sibling = f"{folder}/ck", f"{folder}/ck-other"
    for name in ("offsets/0", "offsets/1", "commits/0", "metadata"):
        storage.write(f"{checkpoint}/{name}", name.encode())
    storage.write(f"{sibling}/x", b"x")
    assert storage.exists(checkpoint) and storage.exists(f"{checkpoint}/metadata")
    assert not storage.exists(f"{checkpoint}/offsets/2") and not storage.exists(f"{folder}/c")
    archived = f"{folder}/_archive/ck-1"
    storage.move_tree(checkpoint, archived)
    assert not storage.exists(checkpoint) and storage.exists(sibling)
    assert storage.list(f"{archived}/offsets") == ["0", "1"]
    assert storage.read(f"{archived}/commits/0") == b"commits/0"
    storage.delete_tree(f"{folder}/_archive")
    assert not storage.exists(archived) and storage.read(f"{sibling}/x") == b"x"
    storage.delete_tree(f"{folder}/_archive")  # gone already: nothing


def race(clients: list[StateStorage], key: str) -> list[int]:
    """Every client creates ``key`` at once; the indexes of those told they created it."""
    start = threading.Barrier(len(clients))
    winners: list[int] = []

    def create(index: int) -> None:
        start.wait()
        if clients[index].create(key, f"racer {index}".encode()):
            winners.append(index)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners


def test_of_racing_creators_exactly_one_wins(store: tuple[Callable[[], StateStorage], str]) -> None:
    make, folder = store
    # A client per racer, each its own host, kept for every round (an S3 client costs ~0.2 s of
    # CPU to build: a new set per round was most of the test), and one more that reads.
    racers, reader = [make() for _ in range(RACERS)], make()
    for round_number in range(ROUNDS):
        key = f"{folder}/race-{round_number}.json"
        winners = race(racers, key)
        assert len(winners) == 1, (round_number, winners)
        assert reader.read(key) == f"racer {winners[0]}".encode()


def test_a_flow_lease_on_the_store_refuses_a_second_owner(
    s3_store: S3Store, tmp_path: Path
) -> None:
    folder = f"s3a://{s3_store.bucket}/{tmp_path.name}/_lease"

    def lease(owner: str) -> FlowLease:
        store = StoredLeaseStore(folder, S3Storage(s3_store.connection))  # a client per host
        return FlowLease("orders", store, owner, {"host": owner, "pid": "1"}, 30.0)

    first = lease("host-a")
    first.acquire()
    with pytest.raises(LeaseHeldError, match="owner host-a"):
        lease("host-b").acquire()
    first.release()
    second = lease("host-b")
    second.acquire()  # a released lease is taken over at once
    latest = StoredLeaseStore(folder, S3Storage(s3_store.connection)).latest()
    assert latest is not None and latest.owner == "host-b"
    assert latest.term == 3  # 1 host-a, 2 its release, 3 host-b


def test_the_store_manager_keeps_port_credentials_and_data_across_restarts(
    kafka_jars_dir: Path, tmp_path: Path
) -> None:
    cli = ServiceCli(kafka_jars_dir, S3_STORE_SCRIPT)
    runtime = tmp_path / "runtime"
    try:
        started = cli.run("start", runtime_dir=runtime)
        assert started.returncode == 0, cli.describe(started)
        state = cli.parse(started)
        credentials = Path(state["credentials_file"])
        secret = json.loads(credentials.read_text())["secret_access_key"]
        assert stat.S_IMODE(os.stat(credentials).st_mode) == 0o600
        assert secret not in started.stdout + started.stderr  # never printed, never in store.json
        assert secret not in (runtime / "s3" / "store.json").read_text()
        again = cli.parse(cli.run("start", runtime_dir=runtime))
        assert again["already_running"] and again["pid"] == state["pid"]

        from pipelines.storage import S3Connection

        connection = S3Connection(state["endpoint"], state["access_key_id"], secret)
        S3Storage(connection).write("s3a://conflux/kept.json", b"{}")
        assert cli.run("stop", runtime_dir=runtime).returncode == 0
        status = cli.run("status", runtime_dir=runtime)
        assert status.returncode == 1 and cli.parse(status)["running"] is False
        restarted = cli.parse(cli.run("start", runtime_dir=runtime))
        assert (restarted["endpoint"], restarted["access_key_id"]) == (
            state["endpoint"],
            state["access_key_id"],
        )
        assert S3Storage(connection).read("s3a://conflux/kept.json") == b"{}"
        assert cli.run("status", runtime_dir=runtime).returncode == 0
    finally:
        cli.run("stop", runtime_dir=runtime)

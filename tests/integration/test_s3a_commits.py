"""Delta commits and Spark checkpoint files on S3 are each ONE conditional PUT (``If-None-Match:
*``): of racing writers (a zombie driver and the flow's new owner, say) exactly one creates a
file, and the others learn that it exists. Conflux's JVM storage classes (platform/jvm/storage,
built by ``make jars``) in the suite's own Spark session, against the project's S3 store
(s3proxy, filesystem backend):

(a) :class:`ConditionalS3ALogStore`: threads committing one new version at once: one wins, the
    rest get ``FileAlreadyExistsException``, the commit holds the winner's actions; a version
    that exists is refused.
(b) :class:`ConditionalCheckpointFileManager`: the same for ``createAtomic(path, false)``;
    ``cancel()`` leaves no object; on a local path it is Spark's own manager.
Whole flows on the store (Delta writes, MERGEs, streams resuming from their checkpoints, every
commit and offset / commit-log file carrying a writer id) are proved where their local-disk twins
are: tests/integration/test_silver.py's kill test and tests/integration/test_gold.py's late rows.

The suite's session is built before this module's store exists (so without its endpoint): the
module reaches a bucket of its own through per-bucket S3A settings (``fs.s3a.bucket.<b>.*``) on
the session's Hadoop configuration, the credentials included (in the JVM's memory only, never in
Spark settings, which is how a Conflux application gets them: :func:`spark_environment`). A bucket
of its own also keeps S3A's FileSystem cache, keyed by bucket, from handing this module a client
of another module's store, or theirs one of this store.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pipelines.jvm import CHECKPOINT_MANAGER_CLASS, LOG_STORE_CLASS
from tests.support.runtime import S3Store

RACERS = 10
VERSIONS = 3
#: User metadata each create of the storage classes carries (``x-amz-meta-conflux-write-id``).
WRITE_ID = "conflux-write-id"
NIO_EXISTS = "java.nio.file.FileAlreadyExistsException"
HADOOP_EXISTS = "org.apache.hadoop.fs.FileAlreadyExistsException"
SCHEMA = "id INT, v STRING"


@dataclass(frozen=True)
class Bucket:
    """This module's bucket on the store, reachable from the suite's session."""

    name: str
    store: S3Store
    hadoop: Any  # the session's org.apache.hadoop.conf.Configuration
    jvm: Any

    def uri(self, key: str) -> str:
        return f"s3a://{self.name}/{key}"

    def path(self, key: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(self.uri(key))

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's HEAD response; None if there is no such object."""
        client = self.store.connection.client()
        try:
            return dict(client.head_object(Bucket=self.name, Key=key))
        except client.exceptions.ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
                return None
            raise

    def read(self, key: str) -> bytes:
        body = self.store.connection.client().get_object(Bucket=self.name, Key=key)["Body"]
        return bytes(body.read())

    def keys(self, prefix: str) -> list[str]:
        listed = self.store.connection.client().list_objects_v2(Bucket=self.name, Prefix=prefix)
        return sorted(item["Key"] for item in listed.get("Contents", []))


@pytest.fixture(scope="module")
def bucket(spark: SparkSession, s3_store: S3Store) -> Iterator[Bucket]:
    """A bucket of this module's own, with per-bucket S3A settings on the session (removed at
    the end). Fails, never skips, if the session has no storage classes (``make jars``)."""
    for key, cls in (
        ("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_MANAGER_CLASS),
        ("spark.delta.logStore.s3a.impl", LOG_STORE_CLASS),
    ):
        if spark.conf.get(key, None) != cls:
            pytest.fail(f"the session has no {key}: run `make jars` (S3A + storage classes)")
    with s3_store.session_bucket(spark, "commits") as name:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        yield Bucket(name, s3_store, hadoop, spark._jvm)


def race(attempt: Callable[[int], None], ready: Callable[[int], None] | None = None) -> list[str]:
    """``RACERS`` threads, each through its own py4j connection: ``ready(i)`` (the part before
    the race), then all at once ``attempt(i)``. Each one's outcome: ``created`` or the class of
    the Java exception it got."""
    start = threading.Barrier(RACERS)
    outcome = ["not run"] * RACERS

    def run(index: int) -> None:
        if ready is not None:
            ready(index)
        start.wait()
        try:
            attempt(index)
            outcome[index] = "created"
        except Py4JJavaError as exc:
            outcome[index] = exc.java_exception.getClass().getName()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcome


def the_winner(outcome: list[str], loss: str) -> int:
    """The one racer that created the file; every other was told it exists."""
    winners = [i for i, result in enumerate(outcome) if result == "created"]
    assert len(winners) == 1, outcome
    assert all(result == loss for i, result in enumerate(outcome) if i != winners[0]), outcome
    return winners[0]


def java_lines(jvm: Any, *lines: str) -> Any:
    """A ``java.util.Iterator<String>`` over ``lines`` (Delta's actions)."""
    array = jvm.java.util.ArrayList()
    for line in lines:
        array.add(line)
    return array.iterator()


def log_store_race(bucket: Bucket, store: Any, key: str) -> None:
    """Every racer commits its own action as ``key`` at once; the winner's is what is there."""
    jvm, hadoop, path = bucket.jvm, bucket.hadoop, bucket.path(key)
    actions = [f'{{"commitInfo":{{"writer":{i},"key":"{key}"}}}}' for i in range(RACERS)]
    lines: list[Any] = [None] * RACERS

    def ready(i: int) -> None:
        lines[i] = java_lines(jvm, actions[i])

    outcome = race(lambda i: store.write(path, lines[i], False, hadoop), ready)
    winner = the_winner(outcome, NIO_EXISTS)
    assert bucket.read(key) == f"{actions[winner]}\n".encode()


def test_log_store_commits_each_version_with_exactly_one_writer(bucket: Bucket) -> None:
    jvm, hadoop = bucket.jvm, bucket.hadoop
    store = jvm.io.conflux.storage.ConditionalS3ALogStore(hadoop)
    assert store.isPartialWriteVisible(bucket.path("t/_delta_log/0.json"), hadoop) is False
    for version in range(VERSIONS):
        key = f"log-store/_delta_log/{version:020d}.json"
        log_store_race(bucket, store, key)
        head = bucket.head(key)
        assert head is not None and WRITE_ID in head["Metadata"]
    key = f"log-store/_delta_log/{0:020d}.json"
    before = bucket.read(key)
    with pytest.raises(Py4JJavaError) as refused:
        store.write(bucket.path(key), java_lines(jvm, '{"late":1}'), False, hadoop)
    assert refused.value.java_exception.getClass().getName() == NIO_EXISTS
    assert bucket.read(key) == before
    store.write(bucket.path("log-store/_last"), java_lines(jvm, "a", "b"), True, hadoop)
    store.write(bucket.path("log-store/_last"), java_lines(jvm, "c"), True, hadoop)  # replaces
    assert bucket.read("log-store/_last") == b"c\n"


def checkpoint_race(bucket: Bucket, manager: Any, key: str) -> None:
    """Every racer opens ``key`` and writes its bytes, then all close (the PUT) at once."""
    streams: list[Any] = [None] * RACERS

    def ready(i: int) -> None:
        streams[i] = manager.createAtomic(bucket.path(key), False)
        streams[i].write(bytearray(f"v1\nwriter {i}".encode()))

    winner = the_winner(race(lambda i: streams[i].close(), ready), HADOOP_EXISTS)
    assert bucket.read(key) == f"v1\nwriter {winner}".encode()


def test_checkpoint_manager_creates_each_log_file_with_exactly_one_writer(bucket: Bucket) -> None:
    jvm, hadoop = bucket.jvm, bucket.hadoop
    manager = jvm.io.conflux.storage.ConditionalCheckpointFileManager(bucket.path("cp"), hadoop)
    assert manager.isConditional() and not manager.isLocal()
    for batch in range(VERSIONS):
        key = f"cp/offsets/{batch}"
        checkpoint_race(bucket, manager, key)
        assert manager.exists(bucket.path(key))

    for overwrite in (False, True):  # a cancelled stream leaves nothing, conditional or not
        key = f"cp/cancelled-{overwrite}"
        stream = manager.createAtomic(bucket.path(key), overwrite)
        stream.write(bytearray(b"never"))
        stream.cancel()
        stream.close()  # after cancel: nothing
        assert bucket.head(key) is None and not manager.exists(bucket.path(key))

    state = bucket.path("cp/state/1.delta")  # state store files: replaced whole, with an id
    for content in (b"first", b"second"):
        stream = manager.createAtomic(state, True)
        stream.write(bytearray(content))
        stream.close()
    assert bucket.read("cp/state/1.delta") == b"second"
    assert [p.getPath().getName() for p in manager.list(bucket.path("cp/offsets"))] == [
        str(b) for b in range(VERSIONS)
    ]


def local_commits(manager: Any, jvm: Any, folder: Path) -> tuple[str, list[str]]:
    """Batch 0 committed, then a rival's try at it: what the rival got and the folder's files
    (a temporary name's random part as ``*``)."""
    offsets = jvm.org.apache.hadoop.fs.Path(str(folder / "offsets"))
    manager.mkdirs(offsets)
    batch = jvm.org.apache.hadoop.fs.Path(offsets, "0")
    for content in (b"batch 0", b"rival"):
        stream = manager.createAtomic(batch, False)
        stream.write(bytearray(content))
        try:
            stream.close()
        except Py4JJavaError as exc:
            stream.cancel()  # as Spark does after a failed close
            refused = str(exc.java_exception.getClass().getName())
    assert (folder / "offsets" / "0").read_bytes() == b"batch 0"
    names = sorted(re.sub(r"[0-9a-f-]{36}", "*", p.name) for p in (folder / "offsets").iterdir())
    return refused, names


def test_checkpoint_manager_is_sparks_own_on_a_local_path(bucket: Bucket, tmp_path: Path) -> None:
    """The same commits through this manager and through the one Spark picks by itself (the
    session's Hadoop configuration names no manager class: that is a SQL setting) end the same
    way: the rename refuses the rival, nothing else changes."""
    jvm, hadoop = bucket.jvm, bucket.hadoop
    ours = jvm.io.conflux.storage.ConditionalCheckpointFileManager(
        jvm.org.apache.hadoop.fs.Path(str(tmp_path / "ours")), hadoop
    )
    assert not ours.isConditional() and ours.isLocal()
    sparks = (
        jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
            jvm.org.apache.hadoop.fs.Path(str(tmp_path / "sparks")), hadoop
        )
    )
    assert sparks.getClass().getSimpleName() == "FileContextBasedCheckpointFileManager"
    expected = local_commits(sparks, jvm, tmp_path / "sparks")
    assert expected[0] == HADOOP_EXISTS
    assert local_commits(ours, jvm, tmp_path / "ours") == expected

"""A flow's tables, checkpoints and state on an S3 store (the project's s3proxy on loopback, a bucket
of this module's own): the zombie, and the commands that read the store.

1. :func:`test_a_zombie_driver_writes_nothing_after_another_took_the_flow_over`: a driver frozen
   (SIGSTOP, with its launcher: a stalled host) in the middle of a batch past its lease; a second
   launcher from another runtime folder takes the flow over and commits; the first, woken, writes
   nothing (no object of the Delta log or the checkpoint changes, no row twice) and stops saying
   it lost its lease. kill -9 never makes a zombie; this does.
2. :func:`test_catalog_and_validate_read_the_store`: ``conflux catalog`` names the s3a://
   locations, ``conflux validate`` probes the bucket's conditional writes and names an
   unreachable store, and no output shows the secret.

The rest of the store's proofs run where their local-disk twins do: the silver kill test
(tests/integration/test_silver.py: a CDC flow killed after a MERGE commit and mid-batch, equal to
the model, every commit a conditional PUT), gold's late rows and backfills
(tests/integration/test_gold.py), and the conditional log store and checkpoint manager raced
directly (tests/integration/test_s3a_commits.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.catalog.state import FlowState
from pipelines.location import Location
from pipelines.runner import EXIT_LEASE
from pipelines.settings import Settings
from pipelines.spec import load_spec
from tests.integration.test_bronze_exactly_once import write_spec
from tests.support.chaos import (
    MID_BATCH,
    FlowFiles,
)
from tests.support.delta_read import read_rows
from tests.support.kafka import create_topic, order_payloads, produce
from tests.support.runtime import KafkaBroker, settings_env

pytestmark = pytest.mark.timeout(1800)
CONFLUX = str(Path(sys.executable).parent / "conflux")
KEYS = int(os.environ.get("STORE_CDC_KEYS", "150"))
#: The metadata header Conflux's JVM storage classes tag each conditional create with.
WRITE_ID_HEADER = "conflux-write-id"


# --- the zombie -----------------------------------------------------------------------------


class Launcher:
    """`conflux run <flow> --continuous` as a terminal runs it: the launcher in its own process
    group, its Spark driver (spark-submit) in another. A stalled host freezes both."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(
            [CONFLUX, "run", *args], env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def groups(self) -> list[int]:
        """The launcher's process group and its children's (the driver leads its own)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        pids = [int(p) for p in children.read_text().split()] if children.exists() else []
        return sorted({self.process.pid, *(os.getpgid(p) for p in pids)})

    def signal(self, groups: list[int], sig: signal.Signals) -> None:
        for group in groups:
            os.killpg(group, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._out.close()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def objects_under(location: Location) -> dict[str, str]:
    """Key -> ETag of every object under ``location``: what a zombie must not change."""
    client = location.storage.client  # type: ignore[attr-defined]
    bucket, _, prefix = location.uri.removeprefix("s3a://").partition("/")
    found: dict[str, str] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.update({item["Key"]: item["ETag"] for item in page.get("Contents", [])})
    return found


def freeze_mid_batch(
    launcher: Launcher, files: FlowFiles, tries: int = 12
) -> tuple[list[int], int]:
    """Freeze the launcher and its driver while a batch is planned and not committed anywhere;
    returns the frozen groups and the batch."""
    for _ in range(tries):
        planned = files.planned_batches()
        seen = planned[-1] if planned else -1
        wait_for(lambda seen=seen: (files.planned_batches() or [-1])[-1] > seen, 300, "a new batch")
        time.sleep(random.uniform(0.0, 0.3))
        groups = launcher.groups()
        launcher.signal(groups, signal.SIGSTOP)
        kind, batch = files.where()
        if kind == MID_BATCH:
            return groups, batch
        launcher.signal(groups, signal.SIGCONT)
    raise AssertionError(f"no freeze landed mid-batch in {tries} tries")


def test_a_zombie_driver_writes_nothing_after_another_took_the_flow_over(
    store_settings: Settings, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = "store_zombie_orders"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
    flows = tmp_path / "flows"
    flow: dict[str, Any] = {
        "name": "store_zombie",
        "source": {"kind": "kafka", "topics": [topic], "max_offsets_per_trigger": 150},
        "target": {"table": "bronze_store_zombie"},
        "trigger": {"mode": "continuous", "interval": "1 second"},
    }
    spec = load_spec(write_spec(flows, flow))
    lease_seconds = 10.0
    host_a = replace(store_settings, lease_seconds=lease_seconds)
    host_b = replace(host_a, runtime_dir=tmp_path / "host-b", jars_dir=store_settings.jars_dir)
    env_a = {**settings_env(host_a), "CONFLUX_FLOWS_DIR": str(flows)}
    env_b = {**settings_env(host_b), "CONFLUX_FLOWS_DIR": str(flows)}
    state = FlowState.of(spec, host_a)
    files = FlowFiles.of(spec, host_a)
    records = order_payloads(2400)
    produce(kafka_broker.bootstrap_servers, topic, records[:1200])

    zombie = Launcher(env_a, tmp_path / "a.log", "store_zombie", "--continuous")
    wait_for(lambda: "conflux.progress " in zombie.output(), 300, "host A's first batch")
    groups, batch = freeze_mid_batch(zombie, files)
    frozen_at = time.time()
    term = state.lease_store().latest()
    assert term is not None and term.owner.startswith("cli-")
    try:
        # past the lease: host B (another runtime folder, the same store) takes the flow over
        wait_for(lambda: time.time() > term.expires_at + 1, 3 * lease_seconds, "the lease to lapse")
        produce(kafka_broker.bootstrap_servers, topic, records[1200:])
        # host B replays the frozen batch with the offsets its log holds, then the rest at once
        del flow["source"]["max_offsets_per_trigger"]
        write_spec(flows, flow)
        taken = subprocess.run(
            [CONFLUX, "run", "store_zombie", "--once"], env=env_b, capture_output=True,
            text=True, timeout=600, check=False,
        )  # fmt: skip
        assert taken.returncode == 0, taken.stdout + taken.stderr
        assert files.batch_committed(batch), "host B finished the batch host A froze in"
        before = {**objects_under(files.delta_log), **objects_under(state.checkpoint)}
        versions = files.delta_versions()
    finally:
        zombie.signal(groups, signal.SIGCONT)  # host A wakes up
    code = zombie.wait(timeout=300)
    output = zombie.output()
    assert code == EXIT_LEASE, output[-4000:]
    # Host B's term, or, when the driver read the store just before the freeze, its own term
    # judged on waking (expired: "not renewed"); either way it stops before writing.
    lost = ("lease is no longer", "released the lease", "was not renewed")
    assert any(message in output for message in lost), output[-4000:]
    after = {**objects_under(files.delta_log), **objects_under(state.checkpoint)}
    assert files.delta_versions() == versions, "the zombie committed a table version"
    changed = {k for k in before if after.get(k) != before[k]}
    assert not changed and set(after) == set(before), (sorted(changed), set(after) - set(before))

    rows = read_rows(state.table, ["key", "value", "partition", "offset"])
    coordinates = Counter((r["partition"], r["offset"]) for r in rows)
    assert len(rows) == len(records) and set(coordinates.values()) == {1}
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(records)
    print(f"froze batch {batch} for {time.time() - frozen_at:.0f} s; zombie said:")
    print("\n".join(line for line in output.splitlines() if "lease" in line)[-2000:])


def test_catalog_and_validate_read_the_store(store_settings: Settings, tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_spec(
        flows,
        {
            "name": "store_catalog",
            "source": {"kind": "kafka", "topics": ["store_catalog"]},
            "target": {"table": "bronze_store_catalog"},
        },
    )
    env = {**settings_env(store_settings), "CONFLUX_FLOWS_DIR": str(flows)}
    shown = subprocess.run(
        [CONFLUX, "catalog", "store_catalog", "--json"], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    catalog = json.loads(shown.stdout)
    assert catalog["tables"][0]["location"].startswith(store_settings.lake_root or "?")
    assert all(v.startswith("s3a://") for v in catalog["state"].values()), catalog["state"]
    assert store_settings.s3_secret_access_key not in shown.stdout + shown.stderr

    validated = subprocess.run(
        [CONFLUX, "validate"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    bucket = (store_settings.lake_root or "").removeprefix("s3a://").partition("/")[0]
    assert validated.returncode == 0, validated.stderr
    assert f"ok  s3a://{bucket}: reachable, conditional writes honoured" in validated.stdout
    unreachable = {**env, "CONFLUX_S3_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    refused = subprocess.run(
        [CONFLUX, "validate"], env=unreachable, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "the S3 store at http://127.0.0.1:9 failed" in refused.stderr, refused.stderr
    assert store_settings.s3_secret_access_key not in refused.stdout + refused.stderr

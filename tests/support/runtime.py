"""Handles on the real local runtime that tests share: the service managers' command lines (the
broker, the S3 store), a running broker and store, and the environment that points a subprocess
at a test runtime folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import PROJECT_ROOT, Settings, settings_environment
from pipelines.storage import S3Connection

BROKER_SCRIPT = PROJECT_ROOT / "platform" / "kafka" / "broker.py"
S3_STORE_SCRIPT = PROJECT_ROOT / "platform" / "s3" / "store.py"


@dataclass(frozen=True)
class ServiceCli:
    """Runs a service manager (``broker.py`` by default, ``store.py``) in a subprocess against a
    given runtime folder and jars folder."""

    jars_dir: Path
    script: Path = BROKER_SCRIPT

    def env(self, runtime_dir: Path, jars_dir: Path | None = None) -> dict[str, str]:
        """The process environment: no inherited ``CONFLUX_*`` variable but these two."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONFLUX_")}
        env["CONFLUX_RUNTIME_DIR"] = str(runtime_dir)
        env["CONFLUX_JARS_DIR"] = str(jars_dir or self.jars_dir)
        return env

    def run(
        self, *args: str, runtime_dir: Path, jars_dir: Path | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run ``<script> <args>``; never raises on a non-zero exit code."""
        return subprocess.run(
            [sys.executable, str(self.script), *args],
            env=self.env(runtime_dir, jars_dir),
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @staticmethod
    def parse(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        """The JSON document the manager printed on stdout; fails the test if there is none."""
        try:
            return dict(json.loads(result.stdout))
        except ValueError:
            pytest.fail(f"the manager printed no JSON:\n{ServiceCli.describe(result)}")

    @staticmethod
    def describe(result: subprocess.CompletedProcess[str]) -> str:
        """A command's exit code and output, for assertion messages."""
        return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@dataclass(frozen=True)
class KafkaBroker:
    """A running local broker: what tests need to reach it and where its files are."""

    bootstrap_servers: str
    runtime_dir: Path
    pid: int
    state: dict[str, Any] = field(default_factory=dict)


def settings_env(settings: Settings) -> dict[str, str]:
    """A subprocess environment that makes ``load_settings()`` return ``settings``, UI off."""
    ui_off = {"spark.ui.enabled": "false", **settings.spark_conf}
    return settings_environment(replace(settings, spark_conf=ui_off))


@dataclass(frozen=True)
class S3Store:
    """A running local S3 store: its connection (secret included) and where its files are."""

    connection: S3Connection
    runtime_dir: Path
    pid: int
    bucket: str

    @contextmanager
    def session_bucket(self, spark: Any, prefix: str) -> Iterator[str]:
        """A new bucket on this store, reachable from the suite's Spark session ``spark``.

        The session was built before this store existed, so without its endpoint: the bucket
        gets per-bucket S3A settings (``fs.s3a.bucket.<name>.*``, the credentials included, in
        the JVM's memory only), removed at the end. A bucket of its own also keeps S3A's
        FileSystem cache, keyed by bucket, from handing a module a client of another module's
        store."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.connection.client().create_bucket(Bucket=name)
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        options = {
            "endpoint": self.connection.endpoint or "",
            "endpoint.region": self.connection.region,
            "connection.ssl.enabled": "false",
            "access.key": self.connection.access_key_id,
            "secret.key": self.connection.secret_access_key,
        }
        for key, value in options.items():
            hadoop.set(f"fs.s3a.bucket.{name}.{key}", value)
        try:
            yield name
        finally:
            for key in options:
                hadoop.unset(f"fs.s3a.bucket.{name}.{key}")

"""Profiles: one switch (``CONFLUX_PROFILE`` or ``profile:`` in conflux.yaml) between where flows run.

- ``local`` (the default): Spark embedded in the launching process (``local[*]``), tables and flow
  state under the runtime folder, Dagster on SQLite in ``<runtime>/dagster``.
- ``cluster``: Spark on the project's standalone cluster (``make cluster-start``), every table,
  checkpoint, lease and status file on the local S3 store (``make s3-start``, bucket
  :data:`LOCAL_BUCKET`), Dagster on the project's PostgreSQL (``make postgres-start``) with its
  instance in ``<runtime>/dagster-cluster``.

A profile only fills in settings nobody set: a master URL, a lake root or S3 credentials given in
conflux.yaml or the environment win, so the cluster profile also serves a real cluster and store
(``CONFLUX_SPARK_MASTER=spark://…``, ``CONFLUX_S3_ENDPOINT=…``). Flow specs never change between
profiles. The values come from what the services saved (the store's credentials, made at its
first start, kept across restarts) and from the running cluster (its master's URL). The
Makefile exports ``DAGSTER_HOME`` from ``CONFLUX_PROFILE`` (the variable: Dagster reads its
instance before Conflux's settings load).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.errors import ConfigError
from pipelines.storage import S3Connection

if TYPE_CHECKING:
    from pipelines.settings import Settings

#: The bucket the local S3 store creates and the cluster profile keeps everything in.
LOCAL_BUCKET = "conflux"
LOCAL_REGION = "us-east-1"
LOOPBACK = "127.0.0.1"


class Profile(StrEnum):
    LOCAL = "local"
    CLUSTER = "cluster"

    @classmethod
    def parse(cls, value: Any, source: str) -> Profile:
        try:
            return cls(str(value))
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise ConfigError(f"{source}: profile {value!r} is not one of {choices}") from None


def dagster_home(runtime_dir: Path, profile: Profile) -> Path:
    """The Dagster instance folder of a profile (the Makefile exports it as DAGSTER_HOME)."""
    return runtime_dir / ("dagster" if profile is Profile.LOCAL else "dagster-cluster")


def profile_values(settings: Settings, missing: Collection[str]) -> dict[str, Any]:
    """The settings the profile of ``settings`` gives, for the fields in ``missing`` only.

    The store and the roots go together: the profile's roots (bucket :data:`LOCAL_BUCKET`) are
    the local store's, never put on a store the user configured.
    """
    if settings.profile is Profile.LOCAL:
        return {}
    try:
        return _cluster_values(settings, missing)
    except ConfigError as exc:
        raise ConfigError(f"profile cluster: {exc}") from None


def _cluster_values(settings: Settings, missing: Collection[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "spark_master" in missing:
        values["spark_master"] = local_master_url(settings.cluster_dir)
    roots = [root for root in ("lake_root", "checkpoints_root") if root in missing]
    s3_fields = {"s3_endpoint", "s3_access_key_id", "s3_secret_access_key", "s3_region"}
    if not s3_fields <= set(missing):  # a store of the user's own: its roots are the user's too
        if roots:
            raise ConfigError(
                "the S3 store is configured, but not where on it the flows go: set "
                "CONFLUX_LAKE_ROOT and CONFLUX_CHECKPOINTS_ROOT (or lake_root and "
                "checkpoints_root in conflux.yaml) to s3a:// prefixes on it"
            )
        return values
    connection = local_store_connection(settings.s3_dir)
    values.update(
        s3_endpoint=connection.endpoint,
        s3_access_key_id=connection.access_key_id,
        s3_secret_access_key=connection.secret_access_key,
        s3_region=connection.region,
    )
    for root in roots:
        values[root] = f"s3a://{LOCAL_BUCKET}/{root.removesuffix('_root')}"
    return values


def local_master_url(cluster_dir: Path) -> str:
    """The master URL of the project's cluster while it runs (its ``cluster.json``)."""
    state = _saved(
        cluster_dir / "cluster.json",
        "the project's Spark cluster is not running",
        "run `make cluster-start`, or set CONFLUX_SPARK_MASTER to your cluster's master URL",
    )
    return str(state["master_url"])


def local_store_connection(s3_dir: Path) -> S3Connection:
    """How to reach the local S3 store, from the credentials it made at its first start."""
    saved = _saved(
        s3_dir / "credentials.json",
        "the local S3 store was never started",
        "run `make s3-start`, or set CONFLUX_S3_ENDPOINT, CONFLUX_S3_ACCESS_KEY_ID and "
        "CONFLUX_S3_SECRET_ACCESS_KEY for your store",
    )
    return S3Connection(
        f"http://{LOOPBACK}:{saved['port']}",
        saved["access_key_id"],
        saved["secret_access_key"],
        LOCAL_REGION,
    )


def _saved(path: Path, problem: str, fix: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{problem} ({path} is missing): {fix}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}): {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object: {fix}")
    return data

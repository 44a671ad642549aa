"""Conflux runtime settings: where the runtime folder and jars live, how Spark and Kafka are reached.

Settings come from three layers, later ones winning:

1. built-in defaults (embedded local runtime under ``<project>/.runtime``),
2. an optional YAML file (``conflux.yaml`` at the project root, or the path in ``CONFLUX_CONFIG``),
3. ``CONFLUX_*`` environment variables.

Unknown keys in the file and unknown ``CONFLUX_*`` variables are errors, so a typo fails fast
instead of being silently ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from pipelines.errors import ConfigError
from pipelines.location import Location, normalize
from pipelines.profiles import Profile, dagster_home, profile_values
from pipelines.storage import S3_SCHEMES, S3Connection

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: Environment variables Conflux reads, mapped to the settings field they set.
ENV_FIELDS: Mapping[str, str] = {
    "CONFLUX_RUNTIME_DIR": "runtime_dir",
    "CONFLUX_JARS_DIR": "jars_dir",
    "CONFLUX_SPARK_MASTER": "spark_master",
    "CONFLUX_SPARK_CONF": "spark_conf",
    "CONFLUX_KAFKA_BOOTSTRAP_SERVERS": "kafka_bootstrap_servers",
    "CONFLUX_FLOWS_DIR": "flows_dir",
    "CONFLUX_LAKE_ROOT": "lake_root",
    "CONFLUX_CHECKPOINTS_ROOT": "checkpoints_root",
    "CONFLUX_LEASE_SECONDS": "lease_seconds",
    "CONFLUX_S3_ENDPOINT": "s3_endpoint",
    "CONFLUX_S3_REGION": "s3_region",
    "CONFLUX_S3_ACCESS_KEY_ID": "s3_access_key_id",
    "CONFLUX_S3_SECRET_ACCESS_KEY": "s3_secret_access_key",
    "CONFLUX_PROFILE": "profile",
}
#: Variables that are read elsewhere (not settings fields) and therefore not unknown.
ENV_OTHER = frozenset({"CONFLUX_CONFIG"})


@dataclass(frozen=True)
class Settings:
    """Resolved Conflux settings.

    Attributes:
        runtime_dir: git-ignored folder for all local state (broker data, lake, checkpoints, logs).
        jars_dir: folder holding ``spark/`` and ``kafka/`` jar folders fetched by ``make setup``.
        spark_master: Spark master URL; ``local[*]`` runs embedded.
        spark_conf: extra Spark settings; they override Conflux's defaults key by key.
        kafka_bootstrap_servers: bootstrap servers; ``None`` means the local broker's address.
        flows_dir: folder of flow spec YAML files.
        lease_seconds: how long a flow's ownership lease lasts without renewal; an orphaned
            Spark application stops within this time (see :mod:`pipelines.lease`).
        lake_root: where tables live unless their spec gives a ``path``: a folder, or an
            ``s3a://bucket/prefix`` (default: ``<runtime_dir>/lake``).
        checkpoints_root: where each flow keeps its checkpoints, lease, identity, status and
            stop channel (``<root>/<flow>/``): a folder or an ``s3a://`` prefix (default:
            ``<runtime_dir>/checkpoints``).
        s3_endpoint, s3_region, s3_access_key_id, s3_secret_access_key: the S3-compatible store
            that ``s3a://`` locations live on (no endpoint: AWS's own). The secret is never shown.
        profile: ``local`` or ``cluster`` (:mod:`pipelines.profiles`): fills in the master, the
            roots and the store's credentials that nothing else set.
    """

    runtime_dir: Path
    jars_dir: Path
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    kafka_bootstrap_servers: str | None = None
    flows_dir: Path = PROJECT_ROOT / "flows"
    lease_seconds: float = 30.0
    lake_root: str | None = None
    checkpoints_root: str | None = None
    s3_endpoint: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = field(default=None, repr=False)
    profile: Profile = Profile.LOCAL

    @property
    def spark_jars_dir(self) -> Path:
        return self.jars_dir / "spark"

    @property
    def kafka_jars_dir(self) -> Path:
        return self.jars_dir / "kafka"

    @property
    def broker_dir(self) -> Path:
        return self.runtime_dir / "kafka"

    @property
    def dagster_home(self) -> Path:
        """The profile's Dagster instance folder (``DAGSTER_HOME``)."""
        return dagster_home(self.runtime_dir, self.profile)

    @property
    def cluster_dir(self) -> Path:
        """The local Spark standalone cluster's folder (``platform/spark/cluster.py``)."""
        return self.runtime_dir / "spark-cluster"

    @property
    def s3_dir(self) -> Path:
        """The local S3 store's folder (``platform/s3/store.py``)."""
        return self.runtime_dir / "s3"

    @property
    def postgres_dir(self) -> Path:
        """The local PostgreSQL server's folder (``platform/postgres/server.py``)."""
        return self.runtime_dir / "postgres"

    @property
    def lake(self) -> Location:
        """The root of tables without a spec ``path`` (``<lake>/<layer>/<table>``)."""
        return self.location(self.lake_root or str(self.runtime_dir / "lake"))

    @property
    def checkpoints(self) -> Location:
        """The root of every flow's state folder (:class:`pipelines.catalog.state.FlowState`)."""
        return self.location(self.checkpoints_root or str(self.runtime_dir / "checkpoints"))

    def location(self, uri: str) -> Location:
        """``uri`` as a location: a relative path is under the runtime folder; an S3 one is
        reached with :meth:`s3_connection`."""
        if urlparse(uri).scheme in S3_SCHEMES:
            return Location.of(uri, self._required_s3_connection(uri))
        return Location.of(normalize(uri, base=self.runtime_dir))

    @property
    def on_cluster(self) -> bool:
        """Whether Spark runs on a cluster (any master but ``local[...]``): executors then run
        on other hosts, which cannot reach this machine's disk."""
        return not self.spark_master.startswith("local")

    @property
    def on_object_store(self) -> bool:
        """Whether the lake or the checkpoints live on an S3 store."""
        return not (self.lake.is_local and self.checkpoints.is_local)

    def _required_s3_connection(self, uri: str) -> S3Connection:
        connection = self.s3_connection()
        if connection is None:
            raise ConfigError(
                f"{uri}: an S3 location needs the store's credentials: set "
                "CONFLUX_S3_ACCESS_KEY_ID and CONFLUX_S3_SECRET_ACCESS_KEY (and CONFLUX_S3_ENDPOINT "
                "for a store other than AWS S3), or the s3_* keys of conflux.yaml"
            )
        return connection

    def s3_connection(self) -> S3Connection | None:
        """The S3 store's connection, or None when no credentials are set."""
        if not (self.s3_access_key_id and self.s3_secret_access_key):
            return None
        return S3Connection(
            self.s3_endpoint, self.s3_access_key_id, self.s3_secret_access_key, self.s3_region
        )

    def resolved_bootstrap_servers(self) -> str:
        """The configured bootstrap servers, or the address of the running local broker."""
        if self.kafka_bootstrap_servers:
            return self.kafka_bootstrap_servers
        state_file = self.broker_dir / "broker.json"
        if not state_file.exists():
            raise ConfigError(
                "no Kafka bootstrap servers configured and the local broker is not running "
                f"({state_file} is missing): run `make broker-start`, or set "
                "CONFLUX_KAFKA_BOOTSTRAP_SERVERS"
            )
        return str(json.loads(state_file.read_text())["bootstrap_servers"])


def load_settings(
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    profile: Profile | None = None,
) -> Settings:
    """Build :class:`Settings` from defaults, the optional YAML file and the environment.

    ``profile`` overrides the configured one: the local services, the jar fetch and the class
    archive are the same on every profile (the cluster profile's values come from them), so
    their scripts load the settings as ``Profile.LOCAL``.
    """
    env = os.environ if environ is None else environ
    _reject_unknown_env(env)
    runtime_dir = PROJECT_ROOT / ".runtime"
    settings = Settings(runtime_dir=runtime_dir, jars_dir=runtime_dir / "jars")
    path = config_file or _config_path(env)
    from_file = _read_config_file(path) if path is not None else {}
    settings = _apply(settings, from_file, source=str(path))
    from_env = {ENV_FIELDS[k]: v for k, v in env.items() if k in ENV_FIELDS}
    settings = _apply(settings, from_env, source="environment")
    if profile is not None:
        settings = replace(settings, profile=profile)
    missing = set(ENV_FIELDS.values()) - set(from_file) - set(from_env)
    settings = _apply(
        settings, profile_values(settings, missing), source=f"profile {settings.profile}"
    )
    for root in (settings.lake_root, settings.checkpoints_root):
        if root and urlparse(root).scheme in S3_SCHEMES:
            settings._required_s3_connection(root)  # fail now, not at the first write
    return settings


def settings_environment(
    settings: Settings, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A process environment in which :func:`load_settings` returns ``settings`` again.

    ``base`` (default: this process's environment) is kept, minus its ``CONFLUX_*`` variables;
    use it to point a child process (a runner, a broker, a benchmark job) at these settings.
    """
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("CONFLUX_")}
    env.update(
        CONFLUX_RUNTIME_DIR=str(settings.runtime_dir),
        CONFLUX_JARS_DIR=str(settings.jars_dir),
        CONFLUX_FLOWS_DIR=str(settings.flows_dir),
        CONFLUX_SPARK_MASTER=settings.spark_master,
        CONFLUX_SPARK_CONF=json.dumps(dict(settings.spark_conf)),
        CONFLUX_LEASE_SECONDS=str(settings.lease_seconds),
        CONFLUX_PROFILE=str(settings.profile),
    )
    roots = {
        "CONFLUX_LAKE_ROOT": settings.lake_root,
        "CONFLUX_CHECKPOINTS_ROOT": settings.checkpoints_root,
    }
    env.update({name: value for name, value in roots.items() if value})
    if settings.kafka_bootstrap_servers:
        env["CONFLUX_KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers
    s3 = {
        "CONFLUX_S3_ENDPOINT": settings.s3_endpoint,
        "CONFLUX_S3_ACCESS_KEY_ID": settings.s3_access_key_id,
        "CONFLUX_S3_SECRET_ACCESS_KEY": settings.s3_secret_access_key,
    }
    env.update({name: value for name, value in s3.items() if value})
    if settings.s3_connection() is not None:
        env["CONFLUX_S3_REGION"] = settings.s3_region
    return env


def _config_path(env: Mapping[str, str]) -> Path | None:
    if "CONFLUX_CONFIG" in env:
        path = Path(env["CONFLUX_CONFIG"])
        if not path.exists():
            raise ConfigError(f"CONFLUX_CONFIG points to {path}, which does not exist")
        return path
    default = PROJECT_ROOT / "conflux.yaml"
    return default if default.exists() else None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def _reject_unknown_env(env: Mapping[str, str]) -> None:
    known = set(ENV_FIELDS) | ENV_OTHER
    unknown = sorted(k for k in env if k.startswith("CONFLUX_") and k not in known)
    if unknown:
        raise ConfigError(
            f"unknown environment variable(s) {', '.join(unknown)}; "
            f"known ones: {', '.join(sorted(known))}"
        )


def _apply(settings: Settings, values: Mapping[str, Any], source: str) -> Settings:
    fields = set(ENV_FIELDS.values())
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}"
        )
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("runtime_dir", "jars_dir", "flows_dir"):
            changes[key] = Path(str(value)).expanduser().resolve()
        elif key == "spark_conf":
            changes[key] = {**settings.spark_conf, **_parse_spark_conf(value, source)}
        elif key == "lease_seconds":
            changes[key] = _parse_lease_seconds(value, source)
        elif key == "profile":
            changes[key] = Profile.parse(value, source)
        elif key in ("lake_root", "checkpoints_root"):
            changes[key] = _parse_root(key, str(value), source)
        else:
            changes[key] = str(value)
    if (
        "runtime_dir" in changes
        and "jars_dir" not in changes
        and settings.jars_dir == (settings.runtime_dir / "jars")
    ):
        changes["jars_dir"] = changes["runtime_dir"] / "jars"
    return replace(settings, **changes)


def _parse_root(key: str, value: str, source: str) -> str:
    """A lake or checkpoints root: a path (kept as given: relative ones are under the runtime
    folder) or an ``s3a://bucket/prefix``; any other scheme fails here, naming the key."""
    try:
        normalized = normalize(value)  # a relative path is kept as given (the runtime folder's)
        if normalized.startswith("s3a://") and not normalized.removeprefix("s3a://"):
            raise ConfigError(f"{value}: no bucket; give s3a://bucket/prefix")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {key}: {exc}") from None
    return normalized if normalized.startswith("s3a://") else value


def _parse_spark_conf(value: Any, source: str) -> dict[str, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}: spark_conf must be a JSON object such as "
                f'{{"spark.sql.shuffle.partitions": "8"}}: {exc}'
            ) from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: spark_conf must be a mapping of Spark setting to value")
    bad = [k for k in value if not str(k).startswith("spark.")]
    if bad:
        raise ConfigError(f"{source}: spark_conf keys must start with 'spark.': {bad}")
    return {str(k): str(v) for k, v in value.items()}


def _parse_lease_seconds(value: Any, source: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if seconds < 3:
        raise ConfigError(
            f"{source}: lease_seconds must be a number of seconds >= 3 (default 30), not {value!r}"
        )
    return seconds

"""Flow specs: one YAML file declares a flow from a source into a bronze Delta table.

A spec is parsed into frozen dataclasses and validated up front; every error names the file and
the field (``flows/orders.yaml: source.topics: ...``). Identifiers are checked against
:data:`IDENTIFIER_RE`, so nothing user-written is pasted into SQL unchecked.

Example::

    name: orders
    source:
      kind: kafka
      topics: [orders]
      starting_offsets: earliest
      max_offsets_per_trigger: 50000
    target:
      table: bronze_orders
      partition_by: [ingest_date]
    trigger:
      mode: available_now        # or: continuous, with interval: "5 seconds"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipelines.errors import ConfigError

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
INTERVAL_RE = re.compile(r"^\d+(\.\d+)?\s*(millisecond|second|minute|hour)s?$")
FILE_FORMATS = ("json", "csv", "parquet")
TRIGGER_MODES = ("available_now", "continuous")
#: Columns bronze adds itself; a user partition column may use ``ingest_date`` too.
BRONZE_PARTITION_COLUMNS = ("ingest_date", "topic")


class SpecError(ConfigError):
    """A flow spec is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class KafkaSource:
    """Read one or several Kafka topics (a list, or a subscribe pattern)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting_offsets: str = "earliest"
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    bootstrap_servers: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    kind: Literal["kafka"] = "kafka"


@dataclass(frozen=True)
class FileSource:
    """Read files that land in a folder (JSON lines, CSV with a header, or Parquet)."""

    path: str
    format: str = "json"
    max_files_per_trigger: int | None = None
    archive_dir: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    kind: Literal["files"] = "files"


Source = KafkaSource | FileSource


@dataclass(frozen=True)
class Target:
    table: str
    path: str | None = None
    partition_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trigger:
    mode: str = "available_now"
    interval: str = "5 seconds"


@dataclass(frozen=True)
class FlowSpec:
    """A validated flow: ``source`` into the bronze table ``target``."""

    name: str
    source: Source
    target: Target
    trigger: Trigger = Trigger()
    description: str = ""
    spec_file: str = "<inline>"


class _Reader:
    """Reads typed fields from a mapping, naming ``file: section.field`` on every error."""

    def __init__(self, data: Any, where: str, section: str) -> None:
        self.where, self.section = where, section
        if not isinstance(data, dict):
            raise self.error("", "expected a mapping")
        self.data: dict[str, Any] = data

    def error(self, key: str, message: str) -> SpecError:
        name = f"{self.section}.{key}" if self.section and key else self.section or key
        return SpecError(f"{self.where}: {name}: {message}")

    def only(self, *allowed: str) -> None:
        unknown = sorted(set(self.data) - set(allowed))
        if unknown:
            raise self.error(unknown[0], f"unknown field; allowed: {', '.join(allowed)}")

    def get(self, key: str, kind: type, default: Any = None, required: bool = False) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.data[key]
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise self.error(key, f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    def identifier(self, key: str, value: str) -> str:
        if not IDENTIFIER_RE.match(value):
            raise self.error(key, f"{value!r} is not a valid identifier (letters, digits, _)")
        return value

    def positive(self, key: str) -> int | None:
        value = self.get(key, int)
        if value is not None and value <= 0:
            raise self.error(key, "must be a positive integer")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.get(key, dict, {}).items()}

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict, required=True), self.where, key)


def load_spec(path: Path) -> FlowSpec:
    """Parse and validate one spec file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from exc
    return parse_spec(data, where=str(path))


def load_specs(folder: Path) -> list[FlowSpec]:
    """All specs in ``folder`` (``*.yaml``), sorted by name; flow and table names must be unique."""
    specs = sorted((load_spec(p) for p in sorted(folder.glob("*.yaml"))), key=lambda s: s.name)
    for attribute in ("name", "target"):
        seen: dict[str, str] = {}
        for spec in specs:
            value = spec.name if attribute == "name" else spec.target.table
            if value in seen:
                raise SpecError(
                    f"{spec.spec_file}: {attribute}: {value!r} is already used by {seen[value]}"
                )
            seen[value] = spec.spec_file
    return specs


def parse_spec(data: Any, where: str = "<inline>") -> FlowSpec:
    """Validate a spec given as a parsed YAML mapping."""
    top = _Reader(data, where, "")
    top.only("name", "description", "source", "target", "trigger")
    name = top.identifier("name", top.get("name", str, required=True))
    trigger = _parse_trigger(top)
    source = _parse_source(top.sub("source"))
    target = _parse_target(top.sub("target"))
    if isinstance(source, FileSource) and "topic" in target.partition_by:
        raise SpecError(f"{where}: target.partition_by: a files source has no topic column")
    return FlowSpec(
        name=name,
        source=source,
        target=target,
        trigger=trigger,
        description=top.get("description", str, ""),
        spec_file=where,
    )


def _parse_source(r: _Reader) -> Source:
    kind = r.get("kind", str, required=True)
    if kind == "kafka":
        return _parse_kafka(r)
    if kind == "files":
        return _parse_files(r)
    raise r.error("kind", f"unknown source kind {kind!r}; known kinds: kafka, files")


def _parse_kafka(r: _Reader) -> KafkaSource:
    r.only(
        "kind", "topics", "pattern", "starting_offsets", "starting_timestamp_ms",
        "max_offsets_per_trigger", "fail_on_data_loss", "bootstrap_servers", "options",
    )  # fmt: skip
    topics = tuple(r.get("topics", list, []))
    pattern = r.get("pattern", str)
    if bool(topics) == bool(pattern):
        raise r.error("topics", "give exactly one of topics (a non-empty list) or pattern")
    for topic in topics:
        if not isinstance(topic, str) or not TOPIC_RE.match(topic):
            raise r.error("topics", f"{topic!r} is not a valid Kafka topic name")
    starting = r.get("starting_offsets", str, "earliest")
    timestamp = r.get("starting_timestamp_ms", int)
    if starting not in ("earliest", "latest", "timestamp"):
        raise r.error("starting_offsets", "must be earliest, latest or timestamp")
    if (starting == "timestamp") != (timestamp is not None):
        raise r.error(
            "starting_timestamp_ms", "is required exactly when starting_offsets is timestamp"
        )
    options = r.string_map("options")
    bad = [k for k in options if not k.startswith("kafka.")]
    if bad:
        raise r.error("options", f"only kafka.* client options pass through, not {bad}")
    return KafkaSource(
        topics=topics,
        pattern=pattern,
        starting_offsets=starting,
        starting_timestamp_ms=timestamp,
        max_offsets_per_trigger=r.positive("max_offsets_per_trigger"),
        fail_on_data_loss=r.get("fail_on_data_loss", bool, True),
        bootstrap_servers=r.get("bootstrap_servers", str),
        options=options,
    )


def _parse_files(r: _Reader) -> FileSource:
    r.only("kind", "path", "format", "max_files_per_trigger", "archive_dir", "options")
    fmt = r.get("format", str, "json")
    if fmt not in FILE_FORMATS:
        raise r.error("format", f"unknown format {fmt!r}; known: {', '.join(FILE_FORMATS)}")
    return FileSource(
        path=str(_local_path(r, "path", r.get("path", str, required=True))),
        format=fmt,
        max_files_per_trigger=r.positive("max_files_per_trigger"),
        archive_dir=r.get("archive_dir", str),
        options=r.string_map("options"),
    )


def _parse_target(r: _Reader) -> Target:
    r.only("table", "path", "partition_by")
    partition_by = tuple(r.get("partition_by", list, []))
    for column in partition_by:
        r.identifier("partition_by", str(column))
        if column not in BRONZE_PARTITION_COLUMNS:
            raise r.error(
                "partition_by",
                f"bronze can be partitioned by {', '.join(BRONZE_PARTITION_COLUMNS)}, not {column!r}",
            )
    return Target(
        table=r.identifier("table", r.get("table", str, required=True)),
        path=_local_path(r, "path", r.get("path", str)),
        partition_by=partition_by,
    )


def _local_path(r: _Reader, key: str, value: str | None) -> str | None:
    """Paths are local or on a mounted shared filesystem for now: the lease, identity and stop
    files beside a flow's checkpoint need one. Refuse a URI instead of misreading it."""
    if value is not None and "://" in value:
        raise r.error(
            key,
            f"{value!r} is a URI; Conflux reads and writes local or mounted paths only so far "
            "(mount the bucket, e.g. with a FUSE or NFS gateway, and give its path)",
        )
    return value


def _parse_trigger(top: _Reader) -> Trigger:
    if "trigger" not in top.data:
        return Trigger()
    r = top.sub("trigger")
    r.only("mode", "interval")
    mode = r.get("mode", str, "available_now")
    if mode not in TRIGGER_MODES:
        raise r.error("mode", f"unknown trigger mode {mode!r}; known: {', '.join(TRIGGER_MODES)}")
    interval = r.get("interval", str, "5 seconds")
    if not INTERVAL_RE.match(interval):
        raise r.error("interval", f"{interval!r} is not an interval such as '5 seconds'")
    return Trigger(mode=mode, interval=interval)

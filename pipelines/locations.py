"""Where a flow keeps its table, checkpoint and control files: derived from the flow, never random.

The checkpoint location must be stable across restarts: Structured Streaming's offset and commit
logs live there, and the exactly-once write is keyed on an id recorded beside it. Everything a flow
owns outside its table lives in one folder per flow, ``<checkpoints>/<flow>/``::

    identity.json        who this flow is: flow id, table, checkpoint generation (pipelines.identity)
    _lease/term-*.json   the ownership lease (pipelines.lease)
    _control/stop.<owner> the stop channel: `conflux stop` creates it, the owner's runner stops
    _status.json         the last committed batch, as the runner last reported it
    <table>/             the bronze stage's Spark checkpoint (offsets/, commits/, ...), stored schema
    silver/              the silver stage's Spark checkpoint (when it runs as its own query)
    gold/<table>/split/  a gold table's late split query (stateless; its Conflux watermark log in
                         conflux_watermark/), gold/<table>/state/ its stateful query (RocksDB state)
    _archive/            checkpoints of earlier generations, moved aside by `conflux reset`
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.lease import FileLeaseStore
from pipelines.settings import Settings
from pipelines.spec import FlowSpec, SpecError, table_field


def resolve(settings: Settings, path: str) -> Path:
    """A spec path: absolute as given, relative to the runtime folder otherwise."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else settings.runtime_dir / candidate


@dataclass(frozen=True)
class FlowLocations:
    flow_dir: Path
    table: Path
    checkpoint: Path
    schema_file: Path

    @classmethod
    def of(cls, spec: FlowSpec, settings: Settings) -> FlowLocations:
        table = (
            resolve(settings, spec.target.path)
            if spec.target.path
            else settings.lake_dir / "bronze" / spec.target.table
        )
        flow_dir = settings.checkpoints_dir / spec.name
        checkpoint = flow_dir / spec.target.table
        return cls(
            flow_dir=flow_dir,
            table=table,
            checkpoint=checkpoint,
            schema_file=checkpoint / "source_schema.json",
        )

    def stage_checkpoint(self, stage: str) -> Path:
        """The Spark checkpoint of a stage that runs as its own query (bronze: :attr:`checkpoint`;
        ``gold.<table>.split`` and ``gold.<table>``: under ``gold/<table>/``)."""
        if stage.startswith("gold."):
            table, _, split = stage.removeprefix("gold.").partition(".")
            return self.flow_dir / "gold" / table / ("split" if split else "state")
        return self.checkpoint if stage == "bronze" else self.flow_dir / stage

    @property
    def identity_file(self) -> Path:
        return self.flow_dir / "identity.json"

    @property
    def lease_dir(self) -> Path:
        return self.flow_dir / "_lease"

    def lease_store(self) -> FileLeaseStore:
        return FileLeaseStore(self.lease_dir)

    @property
    def control_dir(self) -> Path:
        return self.flow_dir / "_control"

    def stop_file(self, owner: str) -> Path:
        """The stop channel of one owner's run: `conflux stop` creates it, that runner stops."""
        return self.control_dir / f"stop.{owner}"

    @property
    def status_file(self) -> Path:
        return self.flow_dir / "_status.json"

    @property
    def health_file(self) -> Path:
        """The running application's heartbeat (:mod:`pipelines.health`)."""
        return self.flow_dir / "_health.json"

    @property
    def archive_dir(self) -> Path:
        return self.flow_dir / "_archive"


def silver_table_path(settings: Settings, table: str, path: str | None = None) -> Path:
    """Where a silver table lives: its spec ``path``, or ``<lake>/silver/<table>``."""
    return resolve(settings, path) if path else settings.lake_dir / "silver" / table


def gold_table_path(settings: Settings, table: str, path: str | None = None) -> Path:
    """Where a gold (or late-data) table lives: its spec ``path``, or ``<lake>/gold/<table>``."""
    return resolve(settings, path) if path else settings.lake_dir / "gold" / table


def gold_input_path(gold_table: Path) -> Path:
    """The on-time rows a gold table's stateful query reads, beside the gold table."""
    return Path(f"{gold_table}__input")


def gold_backfills_path(gold_table: Path) -> Path:
    """The append-only record of a gold table's backfills (the late rows each covered)."""
    return Path(f"{gold_table}__backfills")


def deleted_keys_path(current_table: Path) -> Path:
    """The deleted-keys side table of a current-state table, beside it."""
    return Path(f"{current_table}__deleted_keys")


def table_paths(spec: FlowSpec, settings: Settings) -> dict[str, Path]:
    """Every table a flow writes, by role (bronze, events, quarantine, current, history)."""
    paths = {"bronze": FlowLocations.of(spec, settings).table}
    if spec.silver is not None:
        silver = spec.silver
        paths["events"] = silver_table_path(settings, silver.events.table, silver.events.path)
        paths["quarantine"] = silver_table_path(
            settings, silver.quarantine.table, silver.quarantine.path
        )
        if silver.current is not None:
            paths["current"] = silver_table_path(
                settings, silver.current.table, silver.current.path
            )
        if silver.history is not None:
            paths["history"] = silver_table_path(
                settings, silver.history.table, silver.history.path
            )
    for gold in spec.gold:
        paths[f"gold/{gold.table}"] = gold_table_path(settings, gold.table, gold.path)
        paths[f"late/{gold.table}"] = gold_table_path(settings, gold.late.table, gold.late.path)
    return paths


def check_distinct_tables(specs: Iterable[FlowSpec], settings: Settings) -> None:
    """Two specs (or two roles of one) writing one table location would corrupt it: refuse."""
    seen: dict[Path, tuple[FlowSpec, str]] = {}
    for spec in specs:
        for role, path in table_paths(spec, settings).items():
            table = path.resolve()
            other = seen.get(table)
            if other is not None:
                other_spec, other_role = other
                field = (
                    "target"
                    if role == "bronze"
                    else table_field(role)
                    if "/" in role
                    else f"silver.{role}"
                )
                raise SpecError(
                    f"{spec.spec_file}: {field}: flow {spec.name} writes {table} as its {role} "
                    f"table, which flow {other_spec.name} ({other_spec.spec_file}) writes as its "
                    f"{other_role} table; give each table its own location"
                )
            seen[table] = (spec, role)


def write_json_atomically(path: Path, payload: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``payload`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, default=str, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
        raise

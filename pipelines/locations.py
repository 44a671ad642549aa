"""Where a flow keeps its table, checkpoint and control files: derived from the flow, never random.

The checkpoint location must be stable across restarts: Structured Streaming's offset and commit
logs live there, and the exactly-once write is keyed on an id recorded beside it. Everything a flow
owns outside its table lives in one folder per flow, ``<checkpoints>/<flow>/``::

    identity.json        who this flow is: flow id, table, checkpoint generation (pipelines.identity)
    _lease/term-*.json   the ownership lease (pipelines.lease)
    _control/stop.<owner> the stop channel: `conflux stop` creates it, the owner's runner stops
    _status.json         the last committed batch, as the runner last reported it
    <table>/             the Spark checkpoint (offsets/, commits/, ...) and the stored schema
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
from pipelines.spec import FlowSpec, SpecError


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
    def archive_dir(self) -> Path:
        return self.flow_dir / "_archive"


def check_distinct_tables(specs: Iterable[FlowSpec], settings: Settings) -> None:
    """Two specs writing one table location would corrupt it: refuse at load time."""
    seen: dict[Path, FlowSpec] = {}
    for spec in specs:
        table = FlowLocations.of(spec, settings).table.resolve()
        other = seen.get(table)
        if other is not None:
            raise SpecError(
                f"{spec.spec_file}: target: flow {spec.name} writes {table}, which flow "
                f"{other.name} ({other.spec_file}) writes too; give each flow its own table"
            )
        seen[table] = spec


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

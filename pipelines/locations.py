"""Where a flow keeps its table, checkpoint and stored schema: derived from the flow, never random.

The checkpoint location must be stable across restarts: Structured Streaming's offset and commit
logs live there, and the Delta sink's idempotence is keyed on the query id stored in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.settings import Settings
from pipelines.spec import FlowSpec


def resolve(settings: Settings, path: str) -> Path:
    """A spec path: absolute as given, relative to the runtime folder otherwise."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else settings.runtime_dir / candidate


@dataclass(frozen=True)
class FlowLocations:
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
        checkpoint = settings.checkpoints_dir / spec.name / spec.target.table
        return cls(
            table=table, checkpoint=checkpoint, schema_file=checkpoint / "source_schema.json"
        )

"""Where a flow keeps everything it owns besides its tables: derived from the flow, never random.

The checkpoint location must be stable across restarts: Structured Streaming's offset and commit
logs live there, and the exactly-once write is keyed on an id recorded beside it. Everything a flow
owns outside its tables lives in one folder per flow, ``<checkpoints>/<flow>/``::

    identity.json        who this flow is: flow id, table, checkpoint generation (pipelines.identity)
    _lease/term-*.json   the ownership lease (pipelines.lease)
    _control/stop.<owner> the stop channel: `conflux stop` creates it, the owner's runner stops
    _status.json         the last committed batch, as the runner last reported it
    _health.json         the running application's heartbeat (pipelines.health)
    <table>/             the bronze stage's Spark checkpoint (offsets/, commits/, ...), stored schema
    silver/              the silver stage's Spark checkpoint (when it runs as its own query)
    silver.refresh/      a full refresh's silver checkpoint, silver.refresh.json its marker
    gold/<table>/split/  a gold table's late split query (stateless; its Conflux watermark log in
                         conflux_watermark/, its epoch in conflux_epoch), gold/<table>/state/ its
                         stateful query (RocksDB state)
    _archive/            checkpoints of earlier generations, moved aside by `conflux reset`
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.catalog.roles import BRONZE_STAGE, SILVER_STAGE, gold_stage, is_gold_stage
from pipelines.lease import StoredLeaseStore
from pipelines.location import Location
from pipelines.settings import Settings
from pipelines.spec import FlowSpec


def resolve(settings: Settings, path: str) -> Location:
    """A spec location: an ``s3a://`` URI as given, a path absolute as given or relative to the
    runtime folder."""
    return settings.location(path)


@dataclass(frozen=True)
class FlowState:
    """The flow's folder and every piece of state in it (see the module doc)."""

    flow_dir: Location
    #: The bronze table (its identity is stamped on it; kept here for the identity checks).
    table: Location
    #: The bronze stage's Spark checkpoint.
    checkpoint: Location
    #: The source schema the bronze stage stored on its first run (file sources).
    schema_file: Location

    @classmethod
    def of(cls, spec: FlowSpec, settings: Settings) -> FlowState:
        table = (
            resolve(settings, spec.target.path)
            if spec.target.path
            else settings.lake / "bronze" / spec.target.table
        )
        flow_dir = settings.checkpoints / spec.name
        checkpoint = flow_dir / spec.target.table
        return cls(
            flow_dir=flow_dir,
            table=table,
            checkpoint=checkpoint,
            schema_file=checkpoint / "source_schema.json",
        )

    def stage_checkpoint(self, stage: str) -> Location:
        """The Spark checkpoint of a stage that runs as its own query (bronze: :attr:`checkpoint`;
        ``gold.<table>.split`` and ``gold.<table>``: under ``gold/<table>/``)."""
        if is_gold_stage(stage):
            table, _, split = stage.removeprefix("gold.").partition(".")
            return self.flow_dir / "gold" / table / ("split" if split else "state")
        return self.checkpoint if stage == BRONZE_STAGE else self.flow_dir / stage

    @property
    def silver_checkpoint(self) -> Location:
        return self.stage_checkpoint(SILVER_STAGE)

    def gold_checkpoint(self, gold_table: str, split: bool = False) -> Location:
        """The checkpoint of a gold table's stateful query, or of its split."""
        return self.stage_checkpoint(gold_stage(gold_table, split))

    @property
    def gold_dir(self) -> Location:
        """The checkpoints of every gold query of the flow (what a gold reset moves aside)."""
        return self.flow_dir / "gold"

    def epoch_file(self, gold_table: str) -> Location:
        """The random id made with a gold table's split checkpoint, which tells the split's
        appends apart across a gold reset (:func:`pipelines.stages.gold.checkpoint_epoch`)."""
        return self.gold_checkpoint(gold_table, split=True) / "conflux_epoch"

    def watermark_log(self, gold_table: str) -> Location:
        """The Conflux watermark a gold table's split recorded for each of its batches."""
        return self.gold_checkpoint(gold_table, split=True) / "conflux_watermark"

    @property
    def refresh_checkpoint(self) -> Location:
        """The silver checkpoint a full refresh builds (:mod:`pipelines.silver.refresh`)."""
        return self.flow_dir / "silver.refresh"

    @property
    def refresh_marker(self) -> Location:
        """The pending full refresh, if any (its generation and phase)."""
        return self.flow_dir / "silver.refresh.json"

    @property
    def identity_file(self) -> Location:
        return self.flow_dir / "identity.json"

    @property
    def lease_dir(self) -> Location:
        return self.flow_dir / "_lease"

    def lease_store(self) -> StoredLeaseStore:
        return StoredLeaseStore(self.lease_dir.uri, self.lease_dir.storage)

    @property
    def control_dir(self) -> Location:
        return self.flow_dir / "_control"

    def stop_file(self, owner: str) -> Location:
        """The stop channel of one owner's run: `conflux stop` creates it, that runner stops."""
        return self.control_dir / f"stop.{owner}"

    @property
    def status_file(self) -> Location:
        return self.flow_dir / "_status.json"

    @property
    def health_file(self) -> Location:
        """The running application's heartbeat (:mod:`pipelines.health`)."""
        return self.flow_dir / "_health.json"

    @property
    def archive_dir(self) -> Location:
        return self.flow_dir / "_archive"


def write_json_atomically(location: Location, payload: Mapping[str, Any]) -> None:
    """Replace the file with ``payload`` so that a reader never sees a half-written file."""
    location.write_json(payload)

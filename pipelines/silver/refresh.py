"""Full refresh: rebuild a flow's silver tables from its bronze table, then swap them in.

Use it after changing what a silver table means (keys, the tracked columns of a history, the
schema, the transform), or to repair a table. ``conflux refresh FLOW`` (or the Dagster run config
``full_refresh: true``) runs the flow once, incrementally (``available_now``), holding its lease,
so it is refused while another run of the flow holds the lease:

1. **build**: bronze ingests as in any run; the silver stage runs under a new *silver generation*
   ``k`` (recorded in ``<checkpoints>/<flow>/silver.refresh.json``), with a new checkpoint
   (``silver.refresh``, reading bronze from its first version) and new transaction app ids
   (``conflux-<flow id>-g<generation>-s<k>-<table>``), into tables written *beside* the live ones
   (``<path>__refresh``). Readers keep reading the live tables, unchanged;
2. **swap**, once the silver query has caught up: each live table is replaced by its rebuilt twin
   in one Delta commit (an overwrite, with the schema and partitioning of the twin) carrying the
   new app id and the last batch id, so a repeated swap is skipped by Delta; then the refresh
   checkpoint becomes the silver checkpoint (the old one goes to ``_archive/``) and the flow's
   identity records generation ``k``. Later runs continue from there.

All silver tables of the flow are rebuilt together: they share one checkpoint, so a table rebuilt
alone would stand at another bronze position than its siblings. A run that stops during the build
leaves the marker; the next ``conflux refresh`` resumes it (a plain run refuses while it is
pending), and a crash during the swap is finished by the next refresh, every step being
repeatable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from pipelines.catalog.lifecycle import (
    refuse_started_readers,
    require_own_silver_query,
    sql_properties,
)
from pipelines.catalog.roles import SILVER_STAGE
from pipelines.catalog.state import FlowState, write_json_atomically
from pipelines.catalog.tables import CatalogTable, FlowCatalog
from pipelines.delta_writes import TableWrite, committed_write, table_properties
from pipelines.errors import ConfigError
from pipelines.identity import read_identity, write_identity
from pipelines.lease import FlowLease, new_owner_id, owner_details
from pipelines.location import Location
from pipelines.progress import delta_version
from pipelines.settings import Settings
from pipelines.spec import FlowSpec
from pipelines.timestamps import iso_utc

#: Table properties the swap carries over from the rebuilt twin (Conflux's own records).
_CARRIED_PREFIX = "conflux."


@dataclass(frozen=True)
class SilverRefresh:
    """A full refresh of one flow's silver stage (see the module doc)."""

    flow: str
    generation: int
    started_at: str
    phase: Literal["building", "swapping"] = "building"


def pending_refresh(locations: FlowState) -> SilverRefresh | None:
    """The refresh in progress, if a run started one and it has not finished."""
    path = locations.refresh_marker
    if not path.exists():
        return None
    return SilverRefresh(**json.loads(path.read_text()))


def _save(locations: FlowState, refresh: SilverRefresh) -> None:
    write_json_atomically(locations.refresh_marker, asdict(refresh))


def begin_refresh(spec: FlowSpec, settings: Settings) -> SilverRefresh:
    """Start (or resume) a full refresh of the flow's silver stage; the run holds the lease.

    Raises:
        ConfigError: the flow has no silver stage of its own query to rebuild.
    """
    require_own_silver_query(spec, "refresh")
    refuse_started_readers(spec, settings, "full refresh")
    if spec.gold:
        raise ConfigError(
            f"{spec.spec_file}: flow {spec.name} has gold tables, which stream from the silver "
            "events table that a full refresh overwrites: rebuild silver and gold together with "
            f"`conflux reset {spec.name} --stage silver` (the next run rebuilds both from bronze)"
        )
    locations = FlowState.of(spec, settings)
    pending = pending_refresh(locations)
    if pending is not None:
        return pending
    identity = read_identity(locations)
    current = identity.silver_generation if identity is not None else 0
    refresh = SilverRefresh(
        flow=spec.name,
        generation=current + 1,
        started_at=iso_utc(),
    )
    locations.refresh_checkpoint.remove_tree()  # no half-built leftovers
    _save(locations, refresh)
    return refresh


def refuse_pending(spec: FlowSpec, settings: Settings) -> None:
    """A plain run must not write the live silver tables while a rebuild waits to be swapped in.

    Raises:
        ConfigError: naming how to finish or drop the refresh.
    """
    locations = FlowState.of(spec, settings)
    pending = pending_refresh(locations)
    if pending is not None:
        raise ConfigError(
            f"{spec.spec_file}: flow {spec.name}: a full refresh of its silver tables (generation "
            f"{pending.generation}, started {pending.started_at}) is not finished: finish it with "
            f"`conflux refresh {spec.name}`, or drop it with `conflux refresh {spec.name} "
            f"--abandon`"
        )


def abandon_refresh(spec: FlowSpec, settings: Settings) -> list[str]:
    """Drop a refresh still building: its checkpoint, twins and marker. Returns what was removed.

    Raises:
        LeaseHeldError: a run of the flow holds its lease.
        ConfigError: the refresh is already swapping (finish it instead).
    """
    locations = FlowState.of(spec, settings)
    lease = FlowLease(spec.name, locations.lease_store(), new_owner_id("refresh"), owner_details())
    lease.acquire()  # LeaseHeldError while a run (the refresh itself) holds the flow
    try:
        return _abandon(spec, settings, locations)
    finally:
        lease.release()


def _abandon(spec: FlowSpec, settings: Settings, locations: FlowState) -> list[str]:
    pending = pending_refresh(locations)
    if pending is None:
        return []
    if pending.phase == "swapping":
        raise ConfigError(
            f"flow {spec.name}: the refresh is swapping its tables in; finish it with "
            f"`conflux refresh {spec.name}`"
        )
    removed = [locations.refresh_checkpoint, *(t.rebuilt_path for t in swap_tables(spec, settings))]
    for location in removed:
        location.remove_tree()
    locations.refresh_marker.unlink()
    return [*map(str, removed), str(locations.refresh_marker)]


def last_batch(checkpoint: Location) -> int | None:
    """The last batch id in the checkpoint's commit log."""
    ids = [int(name) for name in (checkpoint / "commits").names() if name.isdigit()]
    return max(ids) if ids else None


def swap_tables(spec: FlowSpec, settings: Settings) -> list[CatalogTable]:
    """Every silver table of the flow (with the deleted-keys side table): what a refresh
    rebuilds beside the live tables and swaps in."""
    return FlowCatalog.of(spec, settings).written_by(SILVER_STAGE)


def complete_refresh(spark: SparkSession, spec: FlowSpec, settings: Settings) -> list[TableWrite]:
    """Swap the rebuilt twins in, then make the refresh checkpoint and generation the flow's.

    Repeatable: a crash anywhere in here is finished by calling it again.
    """
    locations = FlowState.of(spec, settings)
    refresh = pending_refresh(locations)
    identity = read_identity(locations)
    if refresh is None or identity is None:
        return []
    refresh = replace(refresh, phase="swapping")
    _save(locations, refresh)
    building = locations.refresh_checkpoint
    live = locations.silver_checkpoint
    batch = last_batch(building if building.exists() else live)
    tables = swap_tables(spec, settings)
    writes = [
        _swap(spark, table, table.app_id(identity, refresh.generation), batch) for table in tables
    ]
    if building.exists():
        if live.exists():
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            live.move_to(locations.archive_dir / f"silver-{stamp}")
        building.move_to(live)
    write_identity(locations, replace(identity, silver_generation=refresh.generation))
    for table in tables:
        table.rebuilt_path.remove_tree()
    locations.refresh_marker.unlink(missing_ok=True)
    return writes


def resume_swap(spark: SparkSession, spec: FlowSpec, settings: Settings) -> list[TableWrite]:
    """Finish a swap a crash interrupted, before any query of the flow starts."""
    pending = pending_refresh(FlowState.of(spec, settings))
    if pending is None or pending.phase != "swapping":
        return []
    return complete_refresh(spark, spec, settings)


def _swap(spark: SparkSession, table: CatalogTable, app_id: str, batch: int | None) -> TableWrite:
    """Replace the live table by its twin in one commit under (app id, last batch)."""
    twin = table.rebuilt_location
    if not DeltaTable.isDeltaTable(spark, twin):  # swapped (and the twin removed) before a crash
        return TableWrite(table.name, table.id, None, 0, skipped=True)
    before = delta_version(spark, table.location)
    writer = (
        spark.read.format("delta")
        .load(twin)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
    )
    if batch is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", str(batch))
    if table.partition_by:
        writer = writer.partitionBy(*table.partition_by)
    writer.save(table.location)
    carried = {
        k: v
        for k, v in (table_properties(spark, twin) or {}).items()
        if k.startswith(_CARRIED_PREFIX)
    }
    assignments = sql_properties(carried)
    spark.sql(f"ALTER TABLE delta.`{table.location}` SET TBLPROPERTIES ({assignments})")
    # e.g. columns evolved into the old tables that the rebuilt ones do not have
    live = table_properties(spark, table.location) or {}
    stale = [k for k in live if k.startswith(_CARRIED_PREFIX) and k not in carried]
    if stale:
        names = ", ".join(f"'{k}'" for k in stale)
        spark.sql(f"ALTER TABLE delta.`{table.location}` UNSET TBLPROPERTIES IF EXISTS ({names})")
    if batch is None:
        return TableWrite(table.name, table.id, delta_version(spark, table.location), 0, False)
    return committed_write(spark, table.name, table.id, table.location, before, app_id, batch)

"""Stable flow identity: a flow's checkpoint and its table must agree on who they belong to.

The checkpoint is found by the flow's name and the table by ``target``: renaming a flow, deleting
its checkpoint, or pointing a second spec at the table would silently start a new stream over an
existing table and ingest everything again. So each flow records who it is in two places:

* ``identity.json`` beside its checkpoint (:attr:`FlowState.identity_file`): flow name, a flow
  id (a UUID made once), the table, and the checkpoint *generation*;
* the Delta table's properties ``conflux.flow``, ``conflux.flowId`` and ``conflux.generation``.

At start, :func:`resolve_identity` compares them and refuses, naming the way out, when they
disagree. The only way to start over is explicit: ``conflux reset FLOW`` moves the checkpoint aside
(into ``_archive/``), bumps the generation and marks the table for adoption by the next run.

The generation is part of the transaction app id of every Delta write (:attr:`txn_app_id`): a new
checkpoint restarts batch ids at 0, and with the old app id Delta would skip those batches as
already committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from pipelines.catalog.state import FlowState, write_json_atomically
from pipelines.errors import ConfigError
from pipelines.lease import FlowLease, new_owner_id, owner_details
from pipelines.location import Location
from pipelines.spec import FlowSpec
from pipelines.timestamps import iso_utc

FLOW_PROPERTY, FLOW_ID_PROPERTY, GENERATION_PROPERTY = (
    "conflux.flow",
    "conflux.flowId",
    "conflux.generation",
)


class IdentityError(ConfigError):
    """The checkpoint and the table disagree about which flow they belong to."""


@dataclass(frozen=True)
class FlowIdentity:
    flow: str
    flow_id: str
    table: str
    table_path: str
    generation: int
    created_at: str
    #: Set by ``conflux reset``: the next run stamps the table with this identity.
    adopt_table: bool = False
    #: Bumped by each full refresh of the silver stage (:mod:`pipelines.silver.refresh`).
    silver_generation: int = 0

    @property
    def txn_app_id(self) -> str:
        """Delta transaction app id of this flow's writes: one per table and generation."""
        return f"conflux-{self.flow_id}-g{self.generation}"

    def silver_app_id(self, table: str, silver_generation: int | None = None) -> str:
        """The app id of a silver table's writes: a full refresh (a new silver checkpoint whose
        batch ids restart at 0) writes under a new one, ``-s<k>``."""
        generation = self.silver_generation if silver_generation is None else silver_generation
        refreshed = f"-s{generation}" if generation else ""
        return f"{self.txn_app_id}{refreshed}-{table}"

    def table_properties(self) -> dict[str, str]:
        return {
            FLOW_PROPERTY: self.flow,
            FLOW_ID_PROPERTY: self.flow_id,
            GENERATION_PROPERTY: str(self.generation),
        }

    @classmethod
    def new(cls, spec: FlowSpec, locations: FlowState, generation: int = 0) -> FlowIdentity:
        return cls(
            flow=spec.name,
            flow_id=uuid.uuid4().hex,
            table=spec.target.table,
            table_path=str(locations.table),
            generation=generation,
            created_at=iso_utc(),
        )


def read_identity(locations: FlowState) -> FlowIdentity | None:
    path = locations.identity_file
    if not path.exists():
        return None
    try:
        return FlowIdentity(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise IdentityError(
            f"{path}: unreadable flow identity ({exc}); restore it from a backup, or start a "
            f"new checkpoint generation with `conflux reset {locations.flow_dir.name}`"
        ) from exc


def write_identity(locations: FlowState, identity: FlowIdentity) -> None:
    """Replace the identity file atomically."""
    write_json_atomically(locations.identity_file, asdict(identity))


def checkpoint_has_commits(checkpoint: Location) -> bool:
    """Whether Structured Streaming committed any batch in this checkpoint."""
    return any(name.isdigit() for name in (checkpoint / "commits").names())


def checkpoint_has_offsets(checkpoint: Location) -> bool:
    """Whether Structured Streaming planned any batch in this checkpoint (committed or not)."""
    return any(name.isdigit() for name in (checkpoint / "offsets").names())


def resolve_identity(
    spec: FlowSpec, locations: FlowState, table_properties: Mapping[str, str] | None
) -> tuple[FlowIdentity, bool]:
    """The flow's identity, and whether the table must be (re)stamped with it.

    ``table_properties`` are the existing table's properties, or None if there is no table yet.

    Raises:
        IdentityError: the checkpoint and the table disagree; the message says how to resolve it.
    """
    identity = read_identity(locations)
    committed = checkpoint_has_commits(locations.checkpoint)
    table_path = str(locations.table)
    reset_hint = f"`conflux reset {spec.name}`"
    where = f"{spec.spec_file}: flow {spec.name}"
    missing_table = IdentityError(
        f"{where}: the table {table_path} is missing, but the checkpoint "
        f"{locations.checkpoint} has committed batches, so those records would never be written "
        f"again. Restore the table, or start a new checkpoint generation with {reset_hint} "
        "(re-reads the source from its starting_offsets)."
    )
    if identity is not None:
        if identity.flow != spec.name:
            raise IdentityError(
                f"{where}: {locations.identity_file} belongs to flow {identity.flow}: this "
                f"checkpoint folder was copied or moved. Put it back, or run {reset_hint}."
            )
        if identity.table_path != table_path:
            raise IdentityError(
                f"{where}: target: the checkpoint was written for table {identity.table} at "
                f"{identity.table_path}, but the spec now writes {table_path}. Change the "
                f"target back, or start a new checkpoint generation for the new table with "
                f"{reset_hint} (re-reads the source from its starting_offsets)."
            )
        if table_properties is None:
            if committed:
                raise missing_table
            return replace(identity, adopt_table=False), True
        if identity.adopt_table:
            return replace(identity, adopt_table=False), True
        if table_properties.get(FLOW_ID_PROPERTY) is None:
            raise _foreign_table(where, table_path, reset_hint)
        if table_properties.get(FLOW_ID_PROPERTY) == identity.flow_id and table_properties.get(
            GENERATION_PROPERTY
        ) != str(identity.generation):
            raise IdentityError(
                f"{where}: the table {table_path} was last written by generation "
                f"{table_properties.get(GENERATION_PROPERTY)} of this flow, but the checkpoint is "
                f"generation {identity.generation}: an older checkpoint or identity.json was "
                f"restored. Restore the matching one, or run {reset_hint}."
            )
        if table_properties.get(FLOW_ID_PROPERTY) != identity.flow_id:
            raise IdentityError(
                f"{where}: the table {table_path} is owned by flow "
                f"{table_properties.get(FLOW_PROPERTY)} (flow id "
                f"{table_properties.get(FLOW_ID_PROPERTY)}, generation "
                f"{table_properties.get(GENERATION_PROPERTY)}), but this checkpoint is flow id "
                f"{identity.flow_id}, generation {identity.generation}. Another flow took the "
                "table over (a rename followed by a reset, or two specs on one table): give this "
                f"flow its own target, or run {reset_hint} to take the table back."
            )
        return identity, False

    new_identity = FlowIdentity.new(spec, locations)
    if table_properties is None:
        if committed:
            raise missing_table
        return new_identity, True
    owner = table_properties.get(FLOW_PROPERTY)
    if owner is None:
        if committed:  # a checkpoint and table from before flows recorded their identity
            return new_identity, True
        raise _foreign_table(where, table_path, reset_hint)
    if owner == spec.name and committed and table_properties.get(FLOW_ID_PROPERTY):
        # identity.json was lost, the checkpoint and the table are this flow's: rebuild it
        # from the table, keeping the transaction app id, so replays are still skipped.
        rebuilt = FlowIdentity(
            flow=spec.name,
            flow_id=table_properties[FLOW_ID_PROPERTY],
            table=spec.target.table,
            table_path=table_path,
            generation=int(table_properties.get(GENERATION_PROPERTY, "0")),
            created_at=new_identity.created_at,
        )
        return rebuilt, False
    if owner != spec.name:
        raise IdentityError(
            f"{where}: the table {table_path} belongs to flow {owner} (its {FLOW_PROPERTY} "
            f"property), not to {spec.name}. If you renamed flow {owner} to {spec.name}, rename "
            f"it back in {spec.spec_file}: under a new name it would ingest everything into the "
            f"same table again. To start over under the new name on purpose, run {reset_hint} "
            "(re-reads the source from its starting_offsets into this table)."
        )
    raise IdentityError(
        f"{where}: the checkpoint {locations.checkpoint} has no committed batch, but the table {table_path} holds this flow's data: starting again would "
        "re-read the source from its starting_offsets and duplicate rows. Restore the "
        f"checkpoint folder, or start a new checkpoint generation with {reset_hint}."
    )


def _foreign_table(where: str, table_path: str, reset_hint: str) -> IdentityError:
    return IdentityError(
        f"{where}: {table_path} already holds a Delta table that no Conflux flow wrote (it has no "
        f"{FLOW_ID_PROPERTY} property). Point target.path somewhere else, or adopt the table "
        f"with {reset_hint} (keeps its rows and appends the source from its starting_offsets)."
    )


def reset_flow(spec: FlowSpec, locations: FlowState) -> FlowIdentity:
    """Start a new checkpoint generation: archive the checkpoint, bump the generation.

    The next run of the flow starts from the spec's ``starting_offsets`` with a new transaction
    app id and stamps the table (created if missing) with the new identity.

    Raises:
        LeaseHeldError: the flow is running; reset takes the flow's lease for its duration.
    """
    lease = FlowLease(spec.name, locations.lease_store(), new_owner_id("reset"), owner_details())
    lease.acquire()
    try:
        return _reset(spec, locations)
    finally:
        lease.release()


def _reset(spec: FlowSpec, locations: FlowState) -> FlowIdentity:
    old = read_identity(locations)
    generation = (old.generation + 1) if old is not None else 1
    if locations.checkpoint.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target = locations.archive_dir / f"{locations.checkpoint.name}-g{generation - 1}-{stamp}"
        locations.checkpoint.move_to(target)
    identity = replace(
        FlowIdentity.new(spec, locations, generation),
        flow_id=old.flow_id if old is not None else uuid.uuid4().hex,
        adopt_table=True,
    )
    write_identity(locations, identity)
    return identity

"""What the demo left on the S3 store: each flow's tables and state, and how its commits were made.

Run by ``make demo-s3`` after the flows ran with ``CONFLUX_LAKE_ROOT`` / ``CONFLUX_CHECKPOINTS_ROOT``
on the store. For each flow: its tables (objects, size, Delta versions), its state folder (lease
terms, checkpoint files), and whether every Delta commit and every offset / commit-log file was
created by a conditional PUT (``If-None-Match: *``, tagged with its writer's one-off id) — the
guarantee that keeps a zombie driver from overwriting another's commit.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.catalog.tables import FlowCatalog
from pipelines.errors import ConfigError
from pipelines.location import Location
from pipelines.settings import Settings, load_settings
from pipelines.spec import load_specs

WRITE_ID = "conflux-write-id"


def _objects(client: Any, location: Location) -> list[dict[str, Any]]:
    bucket, _, prefix = location.uri.partition("://")[2].partition("/")
    found: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/"
    ):
        found += page.get("Contents", [])
    return found


def _untagged(client: Any, location: Location, names: Iterable[str]) -> list[str]:
    """Names of files in ``location`` written without a writer id (a plain, unconditional PUT)."""
    bucket, _, prefix = location.uri.partition("://")[2].partition("/")
    return [
        name
        for name in names
        if WRITE_ID not in client.head_object(Bucket=bucket, Key=f"{prefix}/{name}")["Metadata"]
    ]


def _size(objects: list[dict[str, Any]]) -> str:
    total = sum(int(o["Size"]) for o in objects)
    return f"{len(objects)} objects, {total / 1024:.0f} KiB"


def show_flow(client: Any, catalog: FlowCatalog) -> None:
    print(f"\nflow {catalog.spec.name}: state in {catalog.state.flow_dir}")
    for table in catalog:
        objects = _objects(client, table.path)
        if not objects:
            continue
        log = table.path / "_delta_log"
        commits = [n for n in log.names() if n.endswith(".json") and n[:-5].isdigit()]
        plain = _untagged(client, log, commits)
        verdict = "every commit conditional" if not plain else f"PLAIN PUTs: {plain[:3]}"
        print(f"  {table.id:<30} {_size(objects):<26} {len(commits)} versions, {verdict}")
    checkpoints = catalog.query_checkpoints()
    for stage, checkpoint in checkpoints.items():
        files = {
            log: [n for n in (checkpoint / log).names() if n.isdigit()]
            for log in ("offsets", "commits")
        }
        plain = [
            f"{log}/{n}"
            for log, names in files.items()
            for n in _untagged(client, checkpoint / log, names)
        ]
        verdict = "all conditional" if not plain else f"PLAIN PUTs: {plain[:3]}"
        print(
            f"  checkpoint {stage:<24} {len(files['offsets'])} offsets, "
            f"{len(files['commits'])} commits, {verdict}"
        )
    terms = catalog.state.lease_dir.names()
    print(f"  lease: {len(terms)} terms kept, newest {terms[-1] if terms else 'none'}")


def main() -> int:
    try:
        settings: Settings = load_settings()
        if settings.lake.is_local:
            print("the lake is on the local disk: set CONFLUX_LAKE_ROOT to an s3a:// prefix")
            return 2
        client = settings.lake.storage.client  # type: ignore[attr-defined]
        print(f"== on the S3 store at {settings.s3_endpoint}: lake {settings.lake}, "
              f"flow state {settings.checkpoints}")  # fmt: skip
        for spec in load_specs(settings.flows_dir):
            show_flow(client, FlowCatalog.of(spec, settings))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Print what the Dagster UI shows of the demo: asset groups with owners, the schedules the specs
declare, what the nightly backfills would ask for now, and the metadata of the latest
materializations (schema, row count, table version, lineage) in the demo's Dagster instance."""

from __future__ import annotations

import sys
import warnings
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dagster import AssetKey, DagsterInstance, RunRequest, build_schedule_context

from assets.builder import build_definitions

SHOWN = (["bronze", "bronze_orders"], ["silver", "silver_orders_events"], ["gold", "revenue_10m"])


def main() -> None:
    warnings.filterwarnings("ignore")
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    groups: dict[str, list[str]] = defaultdict(list)
    owners: dict[str, set[str]] = defaultdict(set)
    for key in sorted(graph.get_all_asset_keys(), key=AssetKey.to_user_string):
        node = graph.get(key)
        group = node.group_name or "default"
        groups[group].append(key.to_user_string())
        owners[group].update(node.owners)
    print("== asset groups (the specs' domains) and owners")
    for group, keys in sorted(groups.items()):
        print(f"{group:10} owners {', '.join(sorted(owners[group])) or '-'}: {len(keys)} assets")
        print(f"           {', '.join(keys)}")

    print("\n== schedules declared in the specs (cron, UTC)")
    now = datetime.now(UTC)
    for schedule in sorted(defs.schedules or [], key=lambda s: s.name):
        line = f"{schedule.name:36} {schedule.cron_schedule:14}"
        if schedule.name.startswith("backfill_"):
            result = schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=now))
            requests = [r for r in result.run_requests or [] if isinstance(r, RunRequest)]
            if requests:
                tags = requests[0].tags
                line += (
                    f" if it ticked now: backfill {tags['dagster/asset_partition_range_start']}.."
                    f"{tags['dagster/asset_partition_range_end']} (the newest closed dates)"
                )
            else:
                line += f" if it ticked now: skipped ({result.skip_message})"
        print(line)

    print("\n== latest materializations in the demo's Dagster instance")
    with DagsterInstance.get() as instance:
        for path in SHOWN:
            event = instance.get_latest_materialization_event(AssetKey(path))
            if event is None or event.asset_materialization is None:
                print(f"{'/'.join(path):28} not materialized yet")
                continue
            metadata = event.asset_materialization.metadata
            schema = metadata.get("dagster/column_schema")
            lineage = metadata.get("dagster/column_lineage")
            columns = len(schema.value.columns) if schema is not None else 0
            rows, version = (
                metadata[k].value if k in metadata else "-"
                for k in ("dagster/row_count", "table_version")
            )
            print(
                f"{'/'.join(path):28} rows {rows}, table version {version}, {columns} columns"
                + (f", lineage of {len(lineage.value.deps_by_column)} columns" if lineage else "")
            )


if __name__ == "__main__":
    main()

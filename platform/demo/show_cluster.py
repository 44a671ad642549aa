"""What ``make demo-cluster`` left behind: where each table lives, what the cluster ran, and the runs
Dagster recorded in PostgreSQL.

For every flow the cluster can run (its tables and state on the S3 store): each table's location,
row count and Delta version, read with delta-rs straight from the store (no Spark). Then the
cluster's applications as its master saw them (cores, duration) and the Dagster runs in the
profile's instance, with the storage that holds them.
"""

from __future__ import annotations

import json
import sys
import urllib.request
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deltalake import DeltaTable, QueryBuilder

from pipelines.catalog.tables import FlowCatalog
from pipelines.settings import Settings, load_settings
from pipelines.spec import FileSource, load_specs


def show_tables(settings: Settings) -> None:
    print("== tables, read with delta-rs from the store")
    for spec in load_specs(settings.flows_dir):
        if isinstance(spec.source, FileSource):
            print(f"{spec.name}: not on the cluster (a file source reads a local landing folder)")
            continue
        for table in FlowCatalog.of(spec, settings):
            try:
                delta = DeltaTable(table.location, storage_options=table.path.delta_rs_options())
            except Exception:  # deltalake's TableNotFoundError: not written (yet)
                continue
            query = QueryBuilder().register("t", delta)
            rows = query.execute("SELECT count(*) AS n FROM t").read_all().column("n")[0].as_py()
            print(
                f"{spec.name:10} {table.id:26} {rows:>6} rows  v{delta.version():<3} "
                f"{table.location}"
            )


def _master_view(settings: Settings) -> dict[str, Any]:
    state = json.loads((settings.cluster_dir / "cluster.json").read_text())
    with urllib.request.urlopen(f"{state['master_ui']}/json/", timeout=5) as reply:
        view: dict[str, Any] = json.loads(reply.read())
    return {**view, "state": state}


def show_applications(settings: Settings) -> None:
    view = _master_view(settings)
    state = view["state"]
    print(
        f"\n== the cluster {state['master_url']}: {len(view.get('workers', []))} workers "
        f"({', '.join(w['id'] for w in view.get('workers', []))}), executors isolated from the "
        f"driver's runtime folder: {state['isolation']}"
    )
    for app in [*view.get("activeapps", []), *view.get("completedapps", [])][-8:]:
        seconds = int(app.get("duration", 0)) // 1000
        print(f"{app['id']}  {app['name']:24} {app['cores']} cores  {seconds:>4} s  {app['state']}")


def show_runs() -> None:
    from dagster import DagsterInstance, RunsFilter

    with DagsterInstance.get() as instance:
        storage = type(instance.run_storage).__name__
        runs = instance.get_runs(RunsFilter(), limit=6)
        print(f"\n== Dagster runs in {storage} ({len(runs)} newest)")
        for run in runs:
            print(f"{run.run_id[:8]}  {run.job_name:20} {run.status.value}")


def main() -> None:
    warnings.filterwarnings("ignore")
    settings = load_settings()
    show_tables(settings)
    show_applications(settings)
    show_runs()


if __name__ == "__main__":
    main()

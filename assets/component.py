"""``ConfluxFlows``: the Dagster component that turns a folder of flow specs into definitions.

Its instance is ``assets/defs/conflux_flows/defs.yaml``; ``dg`` finds the component type through
``[tool.dg.project] registry_modules`` and the ``dagster_dg_cli.registry_modules`` entry point
(``dg list components``), and :mod:`assets.definitions` loads that instance for workspace.yaml::

    type: assets.component.ConfluxFlows
    attributes:
      flows_dir: flows          # optional: default CONFLUX_FLOWS_DIR / the settings' flows folder
      flows: [orders]           # optional: only these flows (default: every spec in the folder)
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from assets.builder import build_definitions


class ConfluxFlows(dg.Component, dg.Resolvable, dg.Model):
    """Conflux flows: a folder of flow specs as streaming Kafka/files -> Delta assets.

    Each flow becomes a multi-asset of its tables (bronze; silver events, quarantine and current
    state), run as one Spark application, with its Kafka topics or landing folder as external
    source assets, a ``run_<flow>`` job and a ``maintain_<flow>`` table-maintenance job (scheduled
    when the spec's ``maintenance.schedule`` says); plus the ``ingest_incremental`` job and its
    schedule, the dead-run-worker sensor and the resources that launch the flows.
    """

    flows_dir: str | None = Field(
        default=None,
        description=(
            "Folder of flow spec YAML files, relative to the project root; default: the "
            "settings' flows folder (CONFLUX_FLOWS_DIR, else <project>/flows)."
        ),
    )
    flows: list[str] | None = Field(
        default=None,
        description="Only the flows of these names (default: every spec in the folder).",
    )

    def resolved_flows_dir(self, project_root: Path) -> Path | None:
        if self.flows_dir is None:
            return None
        path = Path(self.flows_dir).expanduser()
        return path if path.is_absolute() else project_root / path

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return build_definitions(self.resolved_flows_dir(context.project_root), self.flows)

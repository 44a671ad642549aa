"""The Definitions object that workspace.yaml loads: every flow spec in the flows folder.

They are the definitions of the project's ``dg`` defs folder (``assets/defs/``), whose one
instance is the ``ConfluxFlows`` component (:mod:`assets.component`), built by
:func:`assets.builder.build_definitions`, so ``dagster dev -w workspace.yaml``, ``dagster job
execute -m assets.definitions -a defs`` and ``dg`` all load the same thing.
"""

from pathlib import Path

from dagster import load_from_defs_folder

from assets.builder import build_definitions

__all__ = ["build_definitions", "defs"]

defs = load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)

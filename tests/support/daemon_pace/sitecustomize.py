"""Imported at start-up by every Python process of the suite's `dagster dev` (its folder is put
first on their ``PYTHONPATH`` by :func:`tests.support.dagster_ui.dagster_dev`): the daemon's
backfill loop waits ``$DAGSTER_TEST_BACKFILL_INTERVAL_SECONDS`` between iterations instead of
Dagster's 30 s.

Dagster hard-codes that pause (``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS``,
read by the loop on each iteration), and a backfill waits for an iteration twice: to launch its
run and, once the run ended, to be marked completed: up to a minute of idling per backfill in the
UI tests, the same work and the same states otherwise. Nothing is imported unless the process
imports that module itself (the Spark drivers below it never do); the instance's
``auto_materialize.minimum_interval_seconds`` keeps the asset daemon, which also reads the
constant, at its own 30 s.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE = "dagster._daemon.controller"
SECONDS = os.environ.get("DAGSTER_TEST_BACKFILL_INTERVAL_SECONDS")


class _Pace(importlib.abc.MetaPathFinder):
    """Finds ``dagster._daemon.controller`` as usual, and sets the pause once it has run."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if name != MODULE or SECONDS is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.DEFAULT_DAEMON_INTERVAL_SECONDS = float(SECONDS)  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if SECONDS is not None:
    sys.meta_path.insert(0, _Pace())

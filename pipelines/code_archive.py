"""The data plane's Python code, zipped for the executors of a cluster.

In local mode the executors are threads of the driver and import Conflux from its environment.
On a cluster they are other processes on other hosts: whatever Python they run for a batch (a
transform's UDF, a rule's function pickled by reference) must import ``pipelines`` and ``quality``
from what the application ships, not from an installation that may be older or absent there. The
archive is named by its content hash, so every application of one code version shares one file
and a changed file makes a new one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.settings import PROJECT_ROOT, Settings

#: The packages the executors may need: the data plane and the rules it evaluates.
PACKAGES = ("pipelines", "quality")


def _sources() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (PROJECT_ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def code_archive(settings: Settings) -> Path:
    """``<runtime>/code/conflux-<hash>.zip`` holding :data:`PACKAGES`, written if missing."""
    sources = _sources()
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(PROJECT_ROOT)).encode())
        digest.update(path.read_bytes())
    archive = settings.runtime_dir / "code" / f"conflux-{digest.hexdigest()[:16]}.zip"
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    # a file of this process's own: two launches after a code change build it side by side
    descriptor, partial = tempfile.mkstemp(dir=archive.parent, suffix=".zip.tmp")
    with os.fdopen(descriptor, "wb") as handle, zipfile.ZipFile(handle, "w") as zipped:
        for path in sources:
            zipped.write(path, path.relative_to(PROJECT_ROOT), zipfile.ZIP_DEFLATED)
    os.replace(partial, archive)  # older archives stay: running drivers serve them to executors
    return archive


def ship_code(spark: SparkSession, settings: Settings) -> Path:
    """Add the archive to ``spark``'s Python path on every executor (once per application)."""
    archive = code_archive(settings)
    if not any(uri.endswith("/" + archive.name) for uri in spark.sparkContext.listFiles):
        spark.sparkContext.addPyFile(str(archive))
    return archive

"""Fetch the pinned Kafka Connect plugins once and unpack them into ``<jars>/connect-plugins``.

``platform/jvm/fetch_jars.py`` calls :func:`fetch_plugins` (so ``make jars`` and ``make setup``
do); it is not a script of its own.

A Connect plugin is published as an archive (Debezium's ``…-plugin.tar.gz``), not as a jar with a
dependency tree: the archive is the unit Connect isolates. Maven downloads the archives the POM
(``platform/jvm/connect-plugins/pom.xml``) pins, with the same mirror settings as every other jar
set, and each is unpacked into its own folder under ``<jars>/connect-plugins``, the worker's
``plugin.path`` (``platform/connect/worker.py``): one class loader per folder.

As for the jar sets, the folder is fetched again only when its POM changed (its SHA-256 is
recorded in the folder), so the worker starts offline; the swap is atomic (a staging folder
renamed over the old one), so a failed download leaves the previous plugins in place.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from pipelines.errors import ConfigError

#: Folder under the jars folder that is Connect's ``plugin.path``.
PLUGINS_DIR = "connect-plugins"
STAMP = ".pom.sha256"
MANIFEST = "MANIFEST.txt"
#: Maven's ``copy-dependencies`` goal: (pom, output folder) -> the pinned artifacts in it.
Copy = Callable[[Path, Path], None]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plugin_folders(target: Path) -> list[Path]:
    """The unpacked plugins: each folder directly under ``target`` that holds jars."""
    if not target.is_dir():
        return []
    return sorted(p for p in target.iterdir() if p.is_dir() and any(p.glob("*.jar")))


def is_current(target: Path, pom: Path) -> bool:
    stamp = target / STAMP
    return (
        stamp.exists()
        and stamp.read_text().strip() == _sha256(pom)
        and bool(plugin_folders(target))
    )


def _unpack(archive: Path, into: Path) -> None:
    """Unpack one plugin archive; ``filter="data"`` refuses absolute paths, ``..`` and devices,
    so a damaged archive cannot write outside ``into``."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise ConfigError(
            f"cannot unpack the Connect plugin {archive.name} ({exc}): delete "
            f"{archive.parent} and run `make jars` again"
        ) from exc


def fetch_plugins(pom: Path, jars_dir: Path, force: bool, copy: Copy) -> list[str]:
    """Fetch and unpack every plugin ``pom`` pins into ``jars_dir/connect-plugins``; return the
    plugin folder names."""
    target = jars_dir / PLUGINS_DIR
    if not force and is_current(target, pom):
        print(f"{PLUGINS_DIR}: up to date in {target}")
        return [p.name for p in plugin_folders(target)]
    staging = jars_dir / f".{PLUGINS_DIR}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    downloads = staging / ".archives"
    copy(pom, downloads)
    archives = sorted(downloads.glob("*.tar.gz"))
    if not archives:
        raise ConfigError(f"Maven fetched no plugin archive (*.tar.gz) for {pom}")
    for archive in archives:
        _unpack(archive, staging)
    shutil.rmtree(downloads)
    folders = plugin_folders(staging)
    if not folders:
        raise ConfigError(f"the plugin archives of {pom} hold no folder of jars")
    jars = sorted(p for folder in folders for p in folder.glob("*.jar"))
    (staging / MANIFEST).write_text(
        "".join(f"{_sha256(p)}  {p.relative_to(staging)}\n" for p in jars)
    )
    (staging / STAMP).write_text(_sha256(pom) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    names = ", ".join(p.name for p in folders)
    print(f"{PLUGINS_DIR}: unpacked {names} ({len(jars)} jars) into {target}")
    return [p.name for p in folders]

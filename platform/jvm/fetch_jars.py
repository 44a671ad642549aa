"""Fetch the pinned JVM jars once, from Maven Central, into the git-ignored jars folder.

Usage: ``python platform/jvm/fetch_jars.py [--force]`` (``make jars`` and ``make setup`` run it).

Closed sets, a folder each; only ``spark`` and ``s3a`` share a classpath (Spark's):

* ``<jars>/spark``: Delta and the Kafka connector, minus every artifact the pyspark wheel already
  ships (Spark's own jars win over ``spark.jars``, so a duplicate is dead weight or a conflict).
* ``<jars>/kafka``: the Apache Kafka broker and its log4j binding, for the broker's own JVM.
* ``<jars>/s3proxy``: the local S3-compatible store (``platform/s3/store.py``), its own JVM.
* ``<jars>/s3a``: Hadoop's S3A connector and the AWS SDK modules it needs (not the 640 MB SDK
  bundle), on Spark's classpath beside ``<jars>/spark``, so also minus pyspark's artifacts.
* ``<jars>/connect``: the Kafka Connect worker (runtime, JSON converter, transforms) at the
  broker's Kafka version and the same log4j binding, for the worker's own JVM
  (``platform/connect/worker.py``).

Connect's plugins are not a jar set: ``fetch_plugins.py`` unpacks each pinned plugin archive
(Debezium's PostgreSQL connector, ``platform/jvm/connect-plugins/pom.xml``) into a folder of its
own under ``<jars>/connect-plugins``, the worker's ``plugin.path``.

A folder is fetched again only when its POM changed (its SHA-256 is recorded beside the jars),
so Spark and the broker start offline and never download anything. Then
``platform/jvm/build_storage.py`` compiles Conflux's storage classes (the conditional-PUT Delta
log store and checkpoint manager) against those jars into ``<jars>/conflux/conflux-storage.jar``,
again only when their sources changed.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # build_storage.py, beside this file

from build_storage import build_storage_jar
from fetch_plugins import fetch_plugins

from pipelines.errors import ConfigError
from pipelines.jvm import S3A_JARS, check_java
from pipelines.profiles import Profile
from pipelines.settings import load_settings

HERE = Path(__file__).resolve().parent
MAVEN_SETTINGS = HERE / "maven-settings.xml"
JAR_SETS = {
    "spark": HERE / "spark" / "pom.xml",
    "kafka": HERE / "kafka" / "pom.xml",
    "s3proxy": HERE / "s3proxy" / "pom.xml",
    S3A_JARS: HERE / "s3a" / "pom.xml",
    "connect": HERE / "connect" / "pom.xml",
}
#: Connect's plugin archives, unpacked into ``<jars>/connect-plugins`` (fetch_plugins.py).
CONNECT_PLUGINS_POM = HERE / "connect-plugins" / "pom.xml"
#: Sets that go on Spark's classpath: the pyspark wheel's jars win there, so a copy is dropped.
ON_SPARK_CLASSPATH = frozenset({"spark", S3A_JARS})
_ARTIFACT_RE = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d+[\w.\-]*)\.jar$")
STAMP = ".pom.sha256"
MANIFEST = "MANIFEST.txt"


def artifact_name(jar_file: str) -> str:
    """``zstd-jni-1.5.7-3.jar`` -> ``zstd-jni``; the name without its version."""
    match = _ARTIFACT_RE.match(jar_file)
    return match.group("artifact") if match else jar_file.removesuffix(".jar")


def pyspark_artifacts() -> set[str]:
    """Artifact names of the jars bundled in the installed pyspark wheel."""
    import pyspark

    bundled = Path(pyspark.__file__).parent / "jars"
    return {artifact_name(p.name) for p in bundled.glob("*.jar")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_current(target: Path, pom: Path) -> bool:
    stamp = target / STAMP
    return stamp.exists() and stamp.read_text().strip() == sha256(pom) and any(target.glob("*.jar"))


def maven_copy_dependencies(pom: Path, output: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(
            "Maven (mvn) is not installed: apt-get install maven, then run `make setup`"
        )
    command = [
        mvn, "-q", "-B", "-s", str(MAVEN_SETTINGS), "-f", str(pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={output}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line][:5]
        raise ConfigError(f"fetching jars for {pom} failed:\n" + "\n".join(errors))


def fetch_set(name: str, pom: Path, jars_dir: Path, force: bool) -> list[str]:
    """Fetch one jar set into ``jars_dir/name``; return the jar names it holds."""
    target = jars_dir / name
    if not force and is_current(target, pom):
        print(f"{name}: up to date in {target}")
        return sorted(p.name for p in target.glob("*.jar"))
    staging = jars_dir / f".{name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    maven_copy_dependencies(pom, staging)
    skip = pyspark_artifacts() if name in ON_SPARK_CLASSPATH else set()
    for jar in staging.glob("*.jar"):
        if artifact_name(jar.name) in skip:
            jar.unlink()
    kept = sorted(staging.glob("*.jar"))
    (staging / MANIFEST).write_text("".join(f"{sha256(p)}  {p.name}\n" for p in kept))
    (staging / STAMP).write_text(sha256(pom) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    print(f"{name}: fetched {len(kept)} jars into {target}")
    return [p.name for p in kept]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="fetch again even if up to date")
    args = parser.parse_args(argv)
    try:
        check_java()
        jars_dir = load_settings(profile=Profile.LOCAL).jars_dir
        jars_dir.mkdir(parents=True, exist_ok=True)
        for name, pom in JAR_SETS.items():
            fetch_set(name, pom, jars_dir, args.force)
        fetch_plugins(CONNECT_PLUGINS_POM, jars_dir, args.force, maven_copy_dependencies)
        build_storage_jar(jars_dir, args.force)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile Conflux's JVM storage classes into ``<jars>/conflux/conflux-storage.jar``.

Usage: ``python platform/jvm/build_storage.py [--force]`` (``make jars`` runs it, through
``fetch_jars.py``, after the jar sets are fetched).

The sources, ``platform/jvm/storage/src/main/java``, are the Delta log store and the Spark
checkpoint file manager that create files on S3 with one conditional PUT (see their Javadoc and
docs/object-storage.md). ``javac --release 17`` compiles them against the jars a driver runs
with: pyspark's, ``<jars>/spark`` (Delta) and ``<jars>/s3a`` (hadoop-aws, the AWS SDK); the
classes are zipped into a jar with fixed timestamps, so the same sources give the same bytes.

The jar is built again only when the hash of the sources and of the compile classpath's jar
names (recorded beside it, as ``fetch_jars.py`` records each POM's) changes. It needs a JDK's
``javac``, not only a Java runtime.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipelines.errors import ConfigError
from pipelines.jvm import S3A_JARS, STORAGE_JAR, require_jars
from pipelines.profiles import Profile
from pipelines.settings import load_settings

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "storage" / "src" / "main" / "java"
JAVA_RELEASE = "17"
JAVAC_OPTIONS = (
    "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-g", "-proc:none",
    "-Xlint:all,-path,-options", "-Werror",
)  # fmt: skip
STAMP = ".sources.sha256"
#: Zip entries get this time (the earliest a zip can hold), so a rebuild gives the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def javac_executable() -> str:
    """``$JAVA_HOME/bin/javac`` when JAVA_HOME is set, else ``javac`` from PATH."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "javac" if java_home else None
    found = str(candidate) if candidate and candidate.exists() else shutil.which("javac")
    if found is None:
        where = f"JAVA_HOME={java_home} has no bin/javac" if java_home else "javac is not on PATH"
        raise ConfigError(
            f"{where}: compiling Conflux's storage classes needs a JDK {JAVA_RELEASE}+, not only "
            "a Java runtime (on Debian: apt-get install openjdk-17-jdk-headless)"
        )
    return found


def java_sources() -> list[Path]:
    sources = sorted(SOURCES.rglob("*.java"))
    if not sources:
        raise ConfigError(f"no Java sources under {SOURCES}")
    return sources


def compile_classpath(jars_dir: Path) -> list[Path]:
    """The jars a driver has: pyspark's, then the fetched Delta and S3A sets."""
    import pyspark

    bundled = require_jars(Path(pyspark.__file__).parent / "jars", "pyspark")
    delta = require_jars(jars_dir / "spark", "Spark (Delta + Kafka connector)")
    return [*bundled, *delta, *require_jars(jars_dir / S3A_JARS, "S3A")]


def build_key(sources: list[Path], classpath: list[Path]) -> str:
    """SHA-256 of the javac options, each source (path and content) and the classpath's names."""
    digest = hashlib.sha256(" ".join(JAVAC_OPTIONS).encode() + b"\n")
    for source in sources:
        digest.update(f"{source.relative_to(SOURCES)}\n".encode())
        digest.update(source.read_bytes())
    digest.update("\n".join(jar.name for jar in classpath).encode())
    return digest.hexdigest()


def compile_sources(sources: list[Path], classpath: list[Path], classes: Path) -> None:
    command = [
        javac_executable(), *JAVAC_OPTIONS, "-cp", os.pathsep.join(map(str, classpath)),
        "-d", str(classes), *map(str, sources),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        errors = (result.stderr or result.stdout).strip().splitlines()[:20]
        raise ConfigError("compiling the storage classes failed:\n" + "\n".join(errors))


def write_jar(classes: Path, jar: Path, key: str) -> None:
    """A jar of every file under ``classes``, its manifest first, entries sorted, fixed times."""
    manifest = (
        "Manifest-Version: 1.0\r\nCreated-By: platform/jvm/build_storage.py\r\n"
        f"Conflux-Build-Key: {key}\r\n\r\n"
    )
    entries = [("META-INF/MANIFEST.MF", manifest.encode())]
    entries += [
        (path.relative_to(classes).as_posix(), path.read_bytes())
        for path in sorted(classes.rglob("*"))
        if path.is_file()
    ]
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)


def is_current(jar: Path, key: str) -> bool:
    stamp = jar.parent / STAMP
    return jar.is_file() and stamp.exists() and stamp.read_text().strip() == key


def build_storage_jar(jars_dir: Path, force: bool = False) -> Path:
    """Compile the sources into ``<jars_dir>/conflux/conflux-storage.jar`` unless it is current.

    Raises:
        ConfigError: no javac, a jar set missing, or the sources do not compile.
    """
    jar = jars_dir / STORAGE_JAR
    sources, classpath = java_sources(), compile_classpath(jars_dir)
    key = build_key(sources, classpath)
    if not force and is_current(jar, key):
        print(f"storage classes: up to date in {jar}")
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=jar.parent) as scratch:
        classes = Path(scratch) / "classes"
        compile_sources(sources, classpath, classes)
        staged = Path(scratch) / jar.name
        write_jar(classes, staged, key)
        (jar.parent / STAMP).unlink(missing_ok=True)  # a crash below leaves it stale, not current
        os.replace(staged, jar)
    (jar.parent / STAMP).write_text(key + "\n")
    print(f"storage classes: compiled {len(sources)} sources into {jar}")
    return jar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="compile again even if up to date")
    args = parser.parse_args(argv)
    try:
        build_storage_jar(load_settings(profile=Profile.LOCAL).jars_dir, args.force)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

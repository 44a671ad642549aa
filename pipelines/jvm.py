"""Checks on the JVM side of the runtime: a recent enough Java and the fetched jar folders, and
where the S3 jars and Conflux's own storage classes live."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from pipelines.errors import ConfigError

MIN_JAVA_MAJOR = 17
_VERSION_RE = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_executable() -> str:
    """The ``java`` binary: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else from PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not candidate.exists():
            raise ConfigError(
                f"JAVA_HOME={java_home} has no bin/java: point it at a JDK {MIN_JAVA_MAJOR}+"
            )
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ConfigError(
            f"Java is not installed: Spark and the Kafka broker need Java {MIN_JAVA_MAJOR} or newer "
            "(on Debian: apt-get install openjdk-17-jdk-headless)"
        )
    return found


def parse_java_major(version_output: str) -> int:
    """The major version from ``java -version`` output (``1.8.0_x`` gives 8, ``17.0.15`` gives 17)."""
    match = _VERSION_RE.search(version_output)
    if match is None:
        raise ConfigError(f"could not read the Java version from: {version_output.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java(java: str | None = None) -> int:
    """Fail with a clear message unless Java >= 17 is available; return its major version."""
    binary = java or java_executable()
    major = parse_java_major(java_version_text(binary))
    if major < MIN_JAVA_MAJOR:
        raise ConfigError(
            f"{binary} is Java {major}; Conflux needs Java {MIN_JAVA_MAJOR} or newer. "
            "Install a newer JDK and set JAVA_HOME to it"
        )
    return major


def require_jars(folder: Path, what: str) -> list[Path]:
    """The jars in ``folder``, or a :class:`ConfigError` telling the user to run ``make setup``."""
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        raise ConfigError(
            f"the {what} jars are not fetched ({folder} is empty or missing): run `make setup`"
        )
    return jars


#: Folder (under the jars folder) of Hadoop's S3A connector and the AWS SDK modules it needs.
S3A_JARS = "s3a"
#: Conflux's JVM storage classes (platform/jvm/storage), compiled by ``make jars``.
STORAGE_JAR = Path("conflux") / "conflux-storage.jar"
#: Delta log store whose commit on S3 is one conditional PUT (``If-None-Match: *``).
LOG_STORE_CLASS = "io.conflux.storage.ConditionalS3ALogStore"
#: Spark checkpoint file manager: conditional PUTs on S3, Spark's own manager anywhere else.
CHECKPOINT_MANAGER_CLASS = "io.conflux.storage.ConditionalCheckpointFileManager"


def storage_jars(jars_dir: Path, required: bool) -> list[Path]:
    """The S3A jar set and ``conflux-storage.jar``, which only come together: S3A without the
    conditional log store and checkpoint manager would commit to S3 by check-then-PUT.

    Args:
        required: the settings point at an S3 store; otherwise a jars folder that has neither
            (fetched before they existed) gives an empty list: a session for local paths only.

    Raises:
        ConfigError: one is there without the other, or ``required`` and they are missing.
    """
    s3a = sorted((jars_dir / S3A_JARS).glob("*.jar")) if (jars_dir / S3A_JARS).is_dir() else []
    storage = jars_dir / STORAGE_JAR
    if s3a and storage.is_file():
        return [*s3a, storage]
    if not s3a and not storage.exists() and not required:
        return []
    missing = [
        str(p) for p, ok in ((jars_dir / S3A_JARS, s3a), (storage, storage.is_file())) if not ok
    ]
    raise ConfigError(
        f"the S3 jars are incomplete ({', '.join(missing)} missing): run `make jars`, which "
        "fetches the S3A connector and compiles Conflux's storage classes"
    )


#: JVM options of a Spark driver that lives seconds to a minute or two on small data (the test
#: suite's launches, the class archive's training run): C1 alone, since C2's compiler threads cost
#: more CPU than its faster code returns there (bench/HISTORY.md, "Suite after issue 22"). Never a
#: product default: a long-running stream wants C2. C1 alone gets a 48 MB code cache, which the
#: S3A and AWS SDK classes fill ("CodeCache is full. Compiler has been disabled": the driver then
#: crawls, interpreted); hence the larger cache.
SHORT_RUN_DRIVER_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=160m"

#: Java class-data archive of a Spark driver with Delta (built by platform/jvm/class_archive.py).
ARCHIVE_NAME = "spark-classes.jsa"
#: Set by the archive builder only: the driver then dumps its classes to this path at exit.
DUMP_ENV = "SPARK_CLASS_ARCHIVE_DUMP"


@functools.cache
def java_version_text(binary: str) -> str:
    """``java -version`` of ``binary`` (run once per binary and process)."""
    result = subprocess.run([binary, "-version"], capture_output=True, text=True, check=False)
    return result.stderr + result.stdout


def archive_key(jars_dir: Path) -> str:
    """What a class archive is only valid for: the JDK, and the path, size and modification time
    of every jar on the driver's classpath (pyspark's) and in ``spark.jars`` (Conflux's): the JVM
    refuses an archive whose classpath changed, so a key that ignored them would call a useless
    archive up to date."""
    import pyspark

    lines = [java_version_text(java_executable()).strip()]
    for folder in (Path(pyspark.__file__).parent / "jars", jars_dir / "spark"):
        for jar in sorted(folder.glob("*.jar")):
            stat = jar.stat()
            lines.append(f"{jar} {stat.st_size} {int(stat.st_mtime)}")
    return "\n".join(lines)


def class_archive(jars_dir: Path) -> Path | None:
    """The class archive beside the jars, if it exists and was built for this JDK and these jars."""
    archive, key = jars_dir / ARCHIVE_NAME, jars_dir / f"{ARCHIVE_NAME}.key"
    try:
        if archive.exists() and key.read_text() == archive_key(jars_dir):
            return archive
    except (OSError, ConfigError):
        pass
    return None


def class_archive_options(jars_dir: Path) -> str:
    """JVM options for a Spark driver: map the class archive if there is a valid one (1-2 s less
    from process start to the first micro-batch on two cores, see bench/HISTORY.md; built by
    platform/jvm/class_archive.py).
    """
    dump = os.environ.get(DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump}"
    archive = class_archive(jars_dir)
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto" if archive is not None else ""

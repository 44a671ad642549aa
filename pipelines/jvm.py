"""Checks on the JVM side of the runtime: a recent enough Java and the fetched jar folders."""

from __future__ import annotations

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
    result = subprocess.run([binary, "-version"], capture_output=True, text=True, check=False)
    major = parse_java_major(result.stderr + result.stdout)
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

"""The Python pins and the JVM manifest must agree: Delta's jar matches delta-spark, the Kafka
connector matches pyspark exactly."""

import re
import tomllib
from importlib.metadata import version

from pipelines.settings import PROJECT_ROOT


def pinned(package: str) -> str:
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    for requirement in pyproject["project"]["dependencies"]:
        match = re.match(rf"^{re.escape(package)}(\[[^\]]+\])?==(.+)$", requirement)
        if match:
            return match.group(2)
    raise AssertionError(f"{package} is not pinned with == in pyproject.toml")


def pom_property(name: str) -> str:
    pom = (PROJECT_ROOT / "platform" / "jvm" / "spark" / "pom.xml").read_text()
    match = re.search(rf"<{name}>([^<]+)</{name}>", pom)
    assert match, name
    return match.group(1)


def test_kafka_connector_matches_pyspark_exactly() -> None:
    assert pom_property("spark.version") == pinned("pyspark") == version("pyspark")


def test_delta_jar_matches_delta_spark() -> None:
    assert pom_property("delta.version") == pinned("delta-spark") == version("delta-spark")


def test_delta_artifact_is_built_for_spark_4_1() -> None:
    pom = (PROJECT_ROOT / "platform" / "jvm" / "spark" / "pom.xml").read_text()
    assert "<artifactId>delta-spark_4.1_2.13</artifactId>" in pom
    assert pinned("pyspark").startswith("4.1.")


def test_platform_is_not_a_python_package() -> None:
    assert not (PROJECT_ROOT / "platform" / "__init__.py").exists()

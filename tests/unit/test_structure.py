"""The house rules of ARCHITECTURE.md, checked on the source so that they stay true: what may
import what, one place for table roles and locations, modules a reader can hold in their head."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.settings import PROJECT_ROOT

PACKAGES = ("pipelines", "assets", "quality")
SOURCES = sorted(p for package in PACKAGES for p in (PROJECT_ROOT / package).rglob("*.py"))
#: Literal role ids and role-shaped prefixes (``"gold/..."``, ``f"late/{t}"``) compared or built.
ROLE_LITERAL = re.compile(
    r"""(==|!=|\bin\b|startswith\()\s*\(?\s*f?["'](bronze|events|quarantine|current|history|"""
    r"""deleted_keys|gold|late|gold_input|gold_backfills)[/"']|f["'](gold|late|gold_input)/\{"""
)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def relative(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT))


def test_no_module_is_over_600_lines() -> None:
    long = {relative(p): n for p in SOURCES if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_silver_and_gold_never_import_each_other() -> None:
    for layer, other in (("silver", "gold"), ("gold", "silver")):
        for path in (PROJECT_ROOT / "pipelines" / layer).rglob("*.py"):
            bad = {m for m in imports_of(path) if m.startswith(f"pipelines.{other}")}
            assert not bad, f"{relative(path)} imports {bad}"


def test_the_data_plane_never_imports_dagster() -> None:
    for path in (PROJECT_ROOT / "pipelines").rglob("*.py"):
        bad = {m for m in imports_of(path) if m.split(".")[0] == "dagster"}
        assert not bad, f"{relative(path)} imports {bad}"


def test_the_data_plane_imports_only_the_rules_of_quality() -> None:
    """``quality/`` (checks, suites) imports ``pipelines``; the only way back is the rules."""
    for path in (PROJECT_ROOT / "pipelines").rglob("*.py"):
        bad = {m for m in imports_of(path) if m.startswith("quality") and m != "quality.rules"}
        assert not bad, f"{relative(path)} imports {bad}"


def test_the_rules_load_nothing_of_pipelines() -> None:
    code = "import sys, quality.rules; print(sorted(m for m in sys.modules if m.startswith('pipelines')))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


#: Where those words mean something else: the spec's own field names, a schema-change policy.
NOT_ROLES = {"pipelines/silver/schema_changes.py"}


@pytest.mark.parametrize("path", SOURCES, ids=relative)
def test_roles_are_compared_and_built_only_in_the_catalog(path: Path) -> None:
    if path.parent.name in ("catalog", "spec") or relative(path) in NOT_ROLES:
        return
    hits = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ROLE_LITERAL.search(line)
    ]
    assert hits == []


def test_the_flow_composer_asks_stages_instead_of_checking_their_class() -> None:
    tree = ast.parse((PROJECT_ROOT / "pipelines" / "flow.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
    ]
    assert calls == []


def test_table_locations_are_derived_only_in_the_catalog() -> None:
    """``settings.lake`` (the default home of every table; ``lake_dir`` before it was a
    Location) and the side tables' suffixes appear in the catalog and nowhere else in the
    product."""
    pattern = re.compile(
        r"\.lake\b|lake_dir\b|__deleted_keys|__input\b|__backfills|__refresh|conflux_watermark"
    )
    for path in SOURCES:
        if path.parent.name == "catalog" or path.name == "settings.py":
            continue
        code = [
            line
            for line in path.read_text().splitlines()
            if pattern.search(line) and "``" not in line and not line.lstrip().startswith("#")
        ]
        assert code == [], relative(path)

"""Reading one spec: a YAML file or a parsed mapping, validated into a :class:`FlowSpec`.

A spec that does not validate raises a :class:`SpecError` with every problem pydantic found
(each field's, each validator's), the first as its message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .base import SpecError, SpecProblem
from .errors import _describe
from .flow import FlowSpec


def read_spec(path: Path) -> Any:
    """The parsed YAML of a spec file (not validated).

    Raises:
        SpecError: the file cannot be read, or is not YAML.
    """
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        line = f"{path}: cannot read the spec: {_one_line(exc)}"
        raise SpecError.of([SpecProblem(str(path), line)]) from exc


def _one_line(exc: Exception) -> str:
    """A YAML error in one line (PyYAML's own shows the spot over several)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        return ": ".join(p for p in (exc.context, exc.problem) if p) + where
    return " ".join(str(exc).split())


def load_spec(path: Path) -> FlowSpec:
    """Parse and validate one spec file."""
    return parse_spec(read_spec(path), where=str(path))


def parse_spec(data: Any, where: str = "<inline>") -> FlowSpec:
    """Validate a spec given as a parsed YAML mapping."""
    try:
        return FlowSpec.model_validate(data, context={"yaml": True, "where": where})
    except ValidationError as exc:
        lines = (f"{where}: {_describe(e)}" for e in exc.errors(include_url=False))
        raise SpecError.of([SpecProblem(where, line) for line in dict.fromkeys(lines)]) from None

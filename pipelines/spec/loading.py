"""Reading one spec: a YAML file or a parsed mapping, validated into a :class:`FlowSpec`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .base import SpecError
from .errors import _describe
from .flow import FlowSpec


def load_spec(path: Path) -> FlowSpec:
    """Parse and validate one spec file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from exc
    return parse_spec(data, where=str(path))


def parse_spec(data: Any, where: str = "<inline>") -> FlowSpec:
    """Validate a spec given as a parsed YAML mapping."""
    try:
        return FlowSpec.model_validate(data, context={"yaml": True, "where": where})
    except ValidationError as exc:
        raise SpecError(f"{where}: {_describe(exc.errors(include_url=False)[0])}") from None

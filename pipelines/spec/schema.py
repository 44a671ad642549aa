"""The JSON Schema of a flow spec file (``conflux schema``; ``flows/flow.schema.json``)."""

from __future__ import annotations

from typing import Any

from .flow import FlowSpec


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a flow spec file (``conflux schema``), with the YAML key names."""
    schema = FlowSpec.model_json_schema(by_alias=True, mode="validation")
    schema.pop("title", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Conflux flow spec",
        **schema,
    }

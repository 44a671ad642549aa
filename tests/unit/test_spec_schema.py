"""The checked-in JSON Schema of flow specs (``flows/flow.schema.json``) for editors."""

import json
from typing import Any

import pytest
import yaml

from pipelines.settings import PROJECT_ROOT
from pipelines.spec import json_schema

FLOWS = PROJECT_ROOT / "flows"


def test_checked_in_schema_is_current() -> None:
    checked_in = json.loads((FLOWS / "flow.schema.json").read_text())
    assert checked_in == json_schema(), "run `conflux schema > flows/flow.schema.json`"


def test_schema_uses_the_yaml_keys_and_a_kind_discriminated_source() -> None:
    schema = json_schema()
    assert schema["title"] == "Conflux flow spec"
    assert "spec_file" not in schema["properties"]
    silver = schema["$defs"]["SilverSpec"]
    assert "schema" in silver["properties"] and "schema_ddl" not in silver["properties"]
    assert silver["required"] == ["format", "schema"]
    assert schema["properties"]["source"]["discriminator"]["propertyName"] == "kind"
    assert schema["$defs"]["KafkaSource"]["required"] == ["kind"]


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = [("", name, prop) for name, prop in schema["properties"].items()]
    for model, definition in schema["$defs"].items():
        found += [(model, name, prop) for name, prop in definition["properties"].items()]
    return found


def test_every_field_is_described() -> None:
    undescribed = [
        f"{m}.{n}" for m, n, prop in _properties(json_schema()) if not prop.get("description")
    ]
    assert not undescribed


def test_every_flow_starts_with_the_schema_comment() -> None:
    for path in sorted(FLOWS.glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=flow.schema.json", path


def test_repository_flows_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(
        json.loads((FLOWS / "flow.schema.json").read_text())
    )
    for path in sorted(FLOWS.glob("*.yaml")):
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, f"{path}: {errors}"


def test_schema_refuses_what_the_spec_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    good = {"name": "x", "source": {"kind": "kafka", "topics": ["t"]}, "target": {"table": "t"}}
    assert validator.is_valid(good)
    assert validator.is_valid({**good, "silver": {"format": "json", "schema": {"id": "bigint"}}})
    assert not validator.is_valid({**good, "source": {"topics": ["t"]}})
    assert not validator.is_valid({**good, "target": {"table": "t", "tabel": "u"}})
    assert not validator.is_valid({**good, "silver": {"format": "avro", "schema": "id int"}})
    assert not validator.is_valid({**good, "silver": {"format": "json", "schema_ddl": "id int"}})


def test_conflux_schema_prints_the_checked_in_schema(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main

    assert main(["schema"]) == 0
    assert capsys.readouterr().out == (FLOWS / "flow.schema.json").read_text()

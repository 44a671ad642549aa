from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import PROJECT_ROOT
from pipelines.spec import FileSource, KafkaSource, SpecError, load_spec, load_specs, parse_spec


def kafka_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        if key:
            spec[section][key] = value
        else:
            spec[section] = value
    return spec


def test_minimal_kafka_spec_gets_defaults() -> None:
    spec = parse_spec(kafka_spec())
    assert isinstance(spec.source, KafkaSource)
    assert spec.source.topics == ("orders",)
    assert spec.source.starting_offsets == "earliest"
    assert spec.trigger.mode == "available_now"


def test_repository_flows_are_valid() -> None:
    specs = load_specs(PROJECT_ROOT / "flows")
    assert {s.name for s in specs} >= {"orders", "orders_files"}
    assert any(isinstance(s.source, FileSource) for s in specs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source__kind": "mqtt"}, r"source.kind: unknown source kind 'mqtt'"),
        ({"source": {"kind": "kafka"}}, r"source.topics: give exactly one of topics"),
        ({"source__topics": ["bad topic!"]}, r"source.topics: 'bad topic!' is not a valid"),
        ({"target__table": "orders; DROP TABLE x"}, r"target.table: .* is not a valid identifier"),
        ({"name": "1orders"}, r"name: '1orders' is not a valid identifier"),
        ({"trigger": {"mode": "sometimes"}}, r"trigger.mode: unknown trigger mode"),
        ({"trigger": {"mode": "continuous", "interval": "soon"}}, r"trigger.interval"),
        (
            {"source__max_offsets_per_trigger": 0},
            r"source.max_offsets_per_trigger: must be a positive",
        ),
        ({"source__starting_offsets": "timestamp"}, r"source.starting_timestamp_ms: is required"),
        ({"source__options": {"group.id": "x"}}, r"source.options: only kafka\.\*"),
        ({"source__topcs": ["x"]}, r"source.topcs: unknown field"),
        ({"target__partition_by": ["amount"]}, r"target.partition_by: bronze can be partitioned"),
        ({"target": None}, r"target: is required"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=rf"^flows/x.yaml: {message}"):
        parse_spec(kafka_spec(**overrides), where="flows/x.yaml")


def test_file_source_spec() -> None:
    spec = parse_spec(
        {
            "name": "landing",
            "source": {"kind": "files", "path": "landing/x", "format": "csv"},
            "target": {"table": "bronze_landing"},
        }
    )
    assert isinstance(spec.source, FileSource)
    assert spec.source.format == "csv"


def test_unknown_file_format_is_named() -> None:
    with pytest.raises(SpecError, match=r"source.format: unknown format 'xml'"):
        parse_spec(
            {
                "name": "landing",
                "source": {"kind": "files", "path": "x", "format": "xml"},
                "target": {"table": "t"},
            }
        )


def test_duplicate_tables_across_specs_are_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\nsource: {{kind: kafka, topics: [t]}}\ntarget: {{table: same}}\n"
        )
    with pytest.raises(SpecError, match=r"b.yaml: target: 'same' is already used"):
        load_specs(tmp_path)


def test_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: cannot read the spec"):
        load_spec(bad)


def test_files_source_cannot_partition_by_topic() -> None:
    with pytest.raises(SpecError, match=r"target\.partition_by: a files source has no topic"):
        parse_spec(
            {
                "name": "landing",
                "source": {"kind": "files", "path": "x"},
                "target": {"table": "t", "partition_by": ["topic"]},
            },
            where="flows/x.yaml",
        )


def test_a_uri_path_is_refused_instead_of_misread() -> None:
    with pytest.raises(SpecError, match=r"target\.path: 's3a://lake/orders' is a URI"):
        parse_spec(
            {
                "name": "orders",
                "source": {"kind": "kafka", "topics": ["orders"]},
                "target": {"table": "orders", "path": "s3a://lake/orders"},
            }
        )

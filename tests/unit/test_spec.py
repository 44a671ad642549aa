from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from pipelines.settings import PROJECT_ROOT
from pipelines.spec import (
    FileSource,
    FlowSpec,
    KafkaSource,
    SpecError,
    Target,
    Trigger,
    load_spec,
    load_specs,
    parse_spec,
)


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


def test_a_table_may_live_on_s3_and_other_schemes_are_refused_naming_the_fix() -> None:
    def spec(target_path: str, landing: str = "landing") -> dict[str, Any]:
        return {
            "name": "orders",
            "source": {"kind": "files", "path": landing},
            "target": {"table": "orders", "path": target_path},
        }

    assert parse_spec(spec("s3a://lake/bronze/orders")).target.path == "s3a://lake/bronze/orders"
    with pytest.raises(SpecError, match=r"target\.path: 'gs://lake/orders'.*s3a://bucket/prefix"):
        parse_spec(spec("gs://lake/orders"))
    with pytest.raises(SpecError, match=r"target\.path: 's3a:///orders' names no bucket"):
        parse_spec(spec("s3a:///orders"))
    with pytest.raises(SpecError, match=r"source\.path: 's3a://lake/in' is a URI.*mount"):
        parse_spec(spec("lake/orders", landing="s3a://lake/in"))


def silver_spec(**silver: Any) -> dict[str, Any]:
    return kafka_spec(
        silver={"format": "debezium", "schema": "id BIGINT, name STRING, ts TIMESTAMP", **silver}
    )


def test_silver_defaults() -> None:
    spec = parse_spec(silver_spec(current={"table": "customers", "keys": ["id"]}))
    assert spec.silver is not None and spec.silver.current is not None
    assert spec.silver.events.table == "silver_orders_events"
    assert spec.silver.quarantine.table == "silver_orders_quarantine"
    assert spec.silver.chaining == "stream"
    assert spec.silver.columns() == ("id", "name", "ts")
    assert spec.silver.sequence_expression == "_source_lsn"
    assert spec.silver.current.keys == ("id",)
    assert spec.silver.current.deleted_key_retention == "7 days"
    assert spec.tables() == [
        ("bronze", "bronze_orders"),
        ("events", "silver_orders_events"),
        ("quarantine", "silver_orders_quarantine"),
        ("current", "customers"),
    ]
    assert parse_spec(kafka_spec()).silver is None
    assert parse_spec(kafka_spec()).tables() == [("bronze", "bronze_orders")]


def test_silver_schema_mapping_becomes_ddl_and_json_sequences_by_offset() -> None:
    spec = parse_spec(
        kafka_spec(silver={"format": "json", "schema": {"id": "bigint", "price": "decimal(10,2)"}})
    )
    assert spec.silver is not None
    assert spec.silver.schema_ddl == "id bigint, price decimal(10,2)"
    assert spec.silver.columns() == ("id", "price")
    assert spec.silver.sequence_expression == "_source_offset"


def test_ddl_columns_split_on_top_level_commas_only() -> None:
    ddl = "id BIGINT, m MAP<STRING, INT>, `from` DECIMAL(10, 2) COMMENT 'a, b', s STRUCT<a: INT, b: INT>"
    spec = parse_spec(silver_spec(schema=ddl))
    assert spec.silver is not None and spec.silver.columns() == ("id", "m", "from", "s")


def test_silver_current_options() -> None:
    current = {
        "table": "customers",
        "keys": ["id"],
        "sequence_by": "coalesce(_source_lsn, 0)",
        "except_columns": ["ts"],
        "partition_by": ["name"],
        "deleted_key_retention": "30 days",
        "ignore_null_updates": True,
    }
    spec = parse_spec(silver_spec(current=current, events={"table": "ev", "path": "/lake/ev"}))
    assert spec.silver is not None and spec.silver.current is not None
    assert spec.silver.sequence_expression == "coalesce(_source_lsn, 0)"
    assert spec.silver.current.kept_columns(spec.silver.columns()) == ("id", "name")
    assert spec.silver.events.path == "/lake/ev"


CURRENT = {"table": "cur", "keys": ["id"]}


@pytest.mark.parametrize(
    ("silver", "message"),
    [
        ({"format": "avro"}, r"silver.format: unknown format 'avro'; known: json, debezium"),
        ({"schema": None}, r"silver.schema: is required"),
        ({"schema": ""}, r"silver.schema: is empty"),
        ({"schema": "id"}, r"silver.schema: column 'id' has no type"),
        ({"schema": "1id int"}, r"silver.schema: column '1id' is not a valid identifier"),
        ({"schema": "id int, ID string"}, r"silver.schema: column 'ID' appears twice"),
        ({"schema": {"id": 5}}, r"silver.schema: column 'id': expected a type string, got int"),
        ({"schema_ddl": "id int"}, r"silver.schema_ddl: unknown field; allowed: format, schema"),
        ({"chaining": "later"}, r"silver.chaining: unknown chaining 'later'"),
        ({"event_time": "when"}, r"silver.event_time: 'when' is not a column of schema"),
        ({"events": {"table": "a b"}}, r"silver.events.table: 'a b' is not a valid identifier"),
        (
            {"quarantine": {"table": "bronze_orders"}},
            r"silver.quarantine.table: 'bronze_orders' is already",
        ),
        ({"current": {"table": "cur"}}, r"silver.current.keys: is required"),
        ({"current": {**CURRENT, "keys": []}}, r"silver.current.keys: is empty"),
        ({"current": {**CURRENT, "keys": ["idd"]}}, r"silver.current.keys: 'idd' is not a column"),
        (
            {"current": {**CURRENT, "columns": ["x"]}},
            r"silver.current.columns: 'x' is not a column",
        ),
        (
            {"current": {**CURRENT, "except_columns": ["id"]}},
            r"silver.current.except_columns: may not name a key",
        ),
        (
            {"current": {**CURRENT, "columns": ["name"], "except_columns": ["ts"]}},
            r"silver.current.except_columns: give columns or except_columns, not both",
        ),
        (
            {"current": {**CURRENT, "columns": ["name"], "partition_by": ["ts"]}},
            r"silver.current.partition_by: 'ts' is not a column of the current table",
        ),
        (
            {"current": {**CURRENT, "delete_when": "name = 'x'"}},
            r"silver.current.delete_when: only with format json",
        ),
        (
            {"current": {**CURRENT, "sequence_by": "lsn"}},
            r"silver.current.sequence_by: 'lsn' is neither a column of schema",
        ),
        (
            {"format": "json", "current": {**CURRENT, "sequence_by": "_source_lsn"}},
            r"silver.current.sequence_by: '_source_lsn' is neither",
        ),
        (
            {"current": {**CURRENT, "deleted_key_retention": "1 week"}},
            r"silver.current.deleted_key_retention: '1 week' is not a retention",
        ),
        ({"current": {**CURRENT, "keys": "id"}}, r"silver.current.keys: expected list, got str"),
        (
            {"current": {**CURRENT, "ignore_null_updates": "yes"}},
            r"silver.current.ignore_null_updates: expected bool, got str",
        ),
        (
            {"current": {**CURRENT, "path": "gs://x"}},
            r"silver.current.path: 'gs://x': Conflux keeps tables on the local disk \(a path\) "
            r"or on an S3-compatible store \(s3a://bucket/prefix\), not on gs:",
        ),
        ({"currnt": CURRENT}, r"silver.currnt: unknown field; allowed: format, schema, event_time"),
        ({"history": {"table": "h"}}, r"silver.history.keys: is required without a current"),
        (
            {"current": CURRENT, "history": {"table": "h", "track_history": ["id"]}},
            r"silver.history.track_history: may not name a key column \(id\)",
        ),
        (
            {"history": {"table": "h", "keys": ["id"], "track_history": ["x"]}},
            r"silver.history.track_history: 'x' is not a column of schema",
        ),
        (
            {
                "history": {
                    "table": "h",
                    "keys": ["id"],
                    "track_history": ["name"],
                    "track_history_except": ["ts"],
                }
            },
            r"silver.history.track_history_except: give track_history or track_history_except",
        ),
        (
            {
                "current": {**CURRENT, "sequence_by": "ts"},
                "history": {"table": "h", "sequence_by": "_source_lsn"},
            },
            r"silver.history.sequence_by: '_source_lsn' differs from current.sequence_by 'ts'",
        ),
        (
            {"current": CURRENT, "history": {"table": "cur"}},
            r"silver.history.table: 'cur' is already the current table",
        ),
        ({"transform": "not a ref"}, r"silver.transform: 'not a ref' is not a function reference"),
        (
            {"current": {**CURRENT, "properties": {"delta.enableDeletionVectors": "true"}}},
            r"silver.current.properties: 'delta.enableDeletionVectors' has a field of its own",
        ),
        (
            {"current": {**CURRENT, "properties": {"conflux.flow": "x"}}},
            r"silver.current.properties: 'conflux.flow': conflux.\* properties",
        ),
        (
            {
                "events": {
                    "table": "e",
                    "properties": {"delta.logRetentionDuration": "interval 1 day"},
                }
            },
            r"silver.events.properties: 'delta.logRetentionDuration' = 'interval 1 day'",
        ),
        (
            {"current": {**CURRENT, "cluster_by": ["name"], "partition_by": ["ts"]}},
            r"silver.current.cluster_by: give cluster_by or partition_by, not both",
        ),
        (
            {"current": {**CURRENT, "column_mapping": "id"}},
            r"silver.current.column_mapping: unknown column_mapping 'id'",
        ),
    ],
)
def test_invalid_silver_specs_name_the_field(silver: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=rf"^flows/x.yaml: {message}"):
        parse_spec(silver_spec(**silver), where="flows/x.yaml")


def test_silver_needs_a_kafka_source() -> None:
    data = silver_spec()
    data["source"] = {"kind": "files", "path": "landing/x"}
    with pytest.raises(SpecError, match=r"^flows/x.yaml: silver: silver parses Kafka payloads"):
        parse_spec(data, where="flows/x.yaml")


def test_an_applied_truncate_needs_a_flow_of_one_topic() -> None:
    """A TRUNCATE empties every row of the flow: of several tables (shards) only its own."""
    data = silver_spec(debezium={"truncate": "apply"}, current={"table": "c", "keys": ["id"]})
    assert parse_spec(data).silver.debezium.truncate == "apply"
    for source in ({"topics": ["a", "b"]}, {"pattern": "shard.*"}):
        data["source"] = {"kind": "kafka", **source}
        with pytest.raises(SpecError, match=r"silver.debezium.truncate: .* must read one table"):
            parse_spec(data)


def test_json_format_may_delete_by_condition() -> None:
    current = {**CURRENT, "delete_when": "name = 'deleted'"}
    spec = parse_spec(silver_spec(format="json", current=current))
    assert spec.silver is not None and spec.silver.current is not None
    assert spec.silver.current.delete_when == "name = 'deleted'"


def test_silver_tables_are_unique_across_flows(tmp_path: Path) -> None:
    for name, table in (("a", "shared"), ("b", "shared")):
        spec = silver_spec(events={"table": table})
        spec["name"], spec["target"] = name, {"table": f"bronze_{name}"}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=r"b.yaml: silver.events.table: 'shared' is already used"):
        load_specs(tmp_path)


def test_more_type_errors_use_python_type_names() -> None:
    cases = [
        ({"source__fail_on_data_loss": "yes"}, "source.fail_on_data_loss: expected bool, got str"),
        (
            {"source__max_offsets_per_trigger": "5"},
            "source.max_offsets_per_trigger: expected int, got str",
        ),
        ({"source__topics": "orders"}, "source.topics: expected list, got str"),
        ({"source": {"topics": ["x"]}}, "source.kind: is required"),
        ({"trigger": "now"}, "trigger: expected dict, got str"),
        (
            {"spec_file": "x"},
            "spec_file: unknown field; allowed: name, description, domain, owners, tags, source",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(SpecError) as caught:
            parse_spec(kafka_spec(**overrides), where="flows/x.yaml")
        assert str(caught.value).startswith(f"flows/x.yaml: {message}")
    with pytest.raises(SpecError, match=r"^flows/x.yaml: the spec must be a mapping, got NoneType"):
        parse_spec(None, where="flows/x.yaml")


def test_specs_are_frozen_typed_models_callers_can_build() -> None:
    spec = FlowSpec(name="x", source=KafkaSource(topics=("t",)), target=Target(table="t"))
    assert (
        spec.source.kind == "kafka" and spec.trigger == Trigger() and spec.spec_file == "<inline>"
    )
    assert FileSource(path="in").kind == "files"
    assert parse_spec(kafka_spec(), where="flows/x.yaml").spec_file == "flows/x.yaml"
    assert spec.model_copy(update={"name": "y"}).name == "y"
    with pytest.raises(ValidationError):
        spec.name = "y"  # type: ignore[misc]


def test_an_event_time_that_is_not_a_time_is_refused() -> None:
    spec = {
        "name": "orders",
        "source": {"kind": "kafka", "topics": ["orders"]},
        "target": {"table": "bronze_orders"},
        "silver": {"format": "json", "schema": "id BIGINT, at BIGINT", "event_time": "at"},
    }
    with pytest.raises(SpecError, match=r"silver.event_time: 'at' is bigint; the event time must"):
        parse_spec(spec, where="flows/x.yaml")


def test_history_takes_keys_and_sequence_from_current_and_tracks_all_by_default() -> None:
    spec = parse_spec(
        silver_spec(
            current={**CURRENT, "sequence_by": "ts"},
            history={"table": "h", "track_history_except": ["ts"]},
        )
    )
    assert spec.silver is not None and spec.silver.history is not None
    assert spec.silver.history_keys == ("id",)
    assert spec.silver.sequence_expression == "ts"
    assert spec.silver.history.tracked_columns(["name", "ts"]) == ("name",)
    assert [role for role, _ in spec.tables()][-1] == "history"
    alone = parse_spec(silver_spec(history={"table": "h", "keys": ["id"], "sequence_by": "ts"}))
    assert alone.silver is not None and alone.silver.sequence_expression == "ts"


def test_table_features_become_delta_properties() -> None:
    spec = parse_spec(
        silver_spec(
            current={
                **CURRENT,
                "deletion_vectors": False,
                "column_mapping": "name",
                "properties": {"delta.checkpointInterval": 20},
            }
        )
    )
    assert spec.silver is not None and spec.silver.current is not None
    assert spec.silver.current.delta_properties(change_data_feed=True, deletion_vectors=True) == {
        "delta.enableChangeDataFeed": "true",
        "delta.enableDeletionVectors": "false",
        "delta.columnMapping.mode": "name",
        "delta.checkpointInterval": "20",
    }


@pytest.mark.parametrize(
    ("maintenance", "message"),
    [
        ({"schedule": "daily"}, r"maintenance.schedule: 'daily' is not a cron expression"),
        ({"vacuum_retention": "2 days"}, r"maintenance.vacuum_retention: '2 days' is below"),
        ({"optimise": True}, r"maintenance.optimise: unknown field"),
    ],
)
def test_invalid_maintenance_names_the_field(maintenance: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=rf"^flows/x.yaml: {message}"):
        parse_spec(kafka_spec(maintenance=maintenance), where="flows/x.yaml")


def test_the_readme_example_spec_is_valid() -> None:
    import re

    import yaml

    from pipelines.settings import PROJECT_ROOT

    readme = (PROJECT_ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert blocks, "README.md has a YAML spec example"
    for block in blocks:
        parse_spec(yaml.safe_load(block), "README.md")

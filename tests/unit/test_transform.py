"""The transform hook's checks, without a JVM: loading a function and judging its output schema."""

from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines.errors import ConfigError
from pipelines.silver.transform import checked_row_schema, load_transform

EVENTS = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("_op", StringType()),
        StructField("_sequence", LongType()),
    ]
)
METADATA = ("_op", "_sequence")


def test_added_columns_join_the_row() -> None:
    output = StructType([*EVENTS.fields, StructField("name_upper", StringType())])
    row = checked_row_schema(output, EVENTS, METADATA, [("id", "silver.current.keys")], "f")
    assert row.fieldNames() == ["id", "name", "name_upper"]


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        (StructType(EVENTS.fields[:3]), "it dropped metadata column _sequence"),
        (
            StructType([*EVENTS.fields[:3], StructField("_sequence", StringType())]),
            "it changed _sequence from bigint to string",
        ),
        (StructType(EVENTS.fields[1:]), "it dropped column id, which silver.current.keys names"),
        (
            StructType([StructField("id", StringType()), *EVENTS.fields[1:]]),
            "it changed id (silver.current.keys) from bigint to string",
        ),
    ],
)
def test_incompatible_output_is_refused(output: StructType, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        checked_row_schema(output, EVENTS, METADATA, [("id", "silver.current.keys")], "f.yaml")
    assert problem in str(refused.value) and str(refused.value).startswith("f.yaml: ")


def test_a_module_beside_the_spec_is_found(tmp_path: Path) -> None:
    spec_file = tmp_path / "flow.yaml"
    spec_file.write_text("name: x\n")
    (tmp_path / "my_transforms.py").write_text("def keep(events):\n    return events\n")
    assert load_transform("my_transforms:keep", str(spec_file))("rows") == "rows"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_such_module_here:f", "cannot import module 'no_such_module_here'"),
        ("my_transforms:missing", "has no function 'missing'"),
    ],
)
def test_a_missing_function_names_the_fix(tmp_path: Path, reference: str, message: str) -> None:
    spec_file = tmp_path / "flow.yaml"
    spec_file.write_text("name: x\n")
    (tmp_path / "my_transforms.py").write_text("def keep(events):\n    return events\n")
    with pytest.raises(ConfigError, match=message) as refused:
        load_transform(reference, str(spec_file))
    assert str(refused.value).startswith(f"{spec_file}: silver.transform: ")

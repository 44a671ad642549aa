"""The schema of a silver stage as a Spark DDL string (or a mapping), parsed without Spark.

Enough of DDL to know the column names and their types as written: commas split columns outside
``<>``, ``()`` and quotes, and a name may be backquoted (a keyword such as ``from``). Spark parses
the full type when the stage starts.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, StrictStr, WithJsonSchema

from .base import _error
from .columns import CURRENT_METADATA_COLUMNS, EVENT_METADATA_COLUMNS, RESCUED_DATA_COLUMN
from .values import IDENTIFIER_RE


def _split_ddl(ddl: str) -> list[str]:
    """Column definitions of a DDL string: split on commas outside <>, () and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in ddl:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return parts


def _name_and_type(part: str) -> tuple[str, str]:
    """``"`from` STRING"`` -> ``("from", "STRING")``: one column definition of a DDL string."""
    if part.startswith("`"):
        end = part.find("`", 1)
        return (part[1:end], part[end + 1 :].strip()) if end > 0 else (part, "")
    name, _, rest = part.partition(" ")
    return name, rest.strip()


def _ddl_columns(ddl: str) -> tuple[str, ...]:
    """Column names of a DDL string such as ``"id BIGINT, `from` STRING"``, checked."""
    names: list[str] = []
    for part in _split_ddl(ddl):
        if not part:
            raise _error(f"an empty column definition in {ddl!r} (a stray comma?)")
        name, rest = _name_and_type(part)
        if not IDENTIFIER_RE.match(name):
            raise _error(f"column {name!r} is not a valid identifier (letters, digits, _)")
        if not rest.strip():
            raise _error(f"column {name!r} has no type (e.g. '{name} STRING')")
        if name.lower() in (n.lower() for n in names):
            raise _error(f"column {name!r} appears twice")
        if (
            name in EVENT_METADATA_COLUMNS
            or name in CURRENT_METADATA_COLUMNS
            or name == RESCUED_DATA_COLUMN
        ):
            raise _error(f"column {name!r} clashes with a column silver adds; rename it")
        names.append(name)
    return tuple(names)


def ddl_fields(ddl: str) -> list[tuple[str, str]]:
    """(name, type as written) of each column of a DDL string, without Spark."""
    return [_name_and_type(part) for part in _split_ddl(ddl) if part]


def _ddl_types(ddl: str) -> dict[str, str]:
    """Column name -> its type as written (lower case), of a DDL string already checked."""
    return {name: kind.lower() for name, kind in ddl_fields(ddl)}


def _schema_ddl(value: Any) -> Any:
    """``{id: bigint, name: string}`` is the DDL string ``"id bigint, name string"``."""
    if not isinstance(value, dict):
        return value
    if not value:
        raise _error("is empty; give the payload's columns and their types")
    columns = []
    for name, kind in value.items():
        if not isinstance(kind, str) or not kind.strip():
            raise _error(f"column {name!r}: expected a type string, got {type(kind).__name__}")
        columns.append(f"{name} {kind.strip()}")
    return ", ".join(columns)


def _check_ddl(value: str) -> str:
    if not value.strip():
        raise _error("is empty; give the payload's columns and their types")
    _ddl_columns(value)
    return value


SchemaDDL = Annotated[
    StrictStr,
    BeforeValidator(_schema_ddl),
    AfterValidator(_check_ddl),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
            ]
        }
    ),
]

"""Pydantic's validation errors in our words: ``dotted.field: message``, one per :class:`SpecError`.

The field is the YAML path (no union tags, list indices only for lists of models); the message
says what is wrong and what to give instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic_core import ErrorDetails

from .base import UnknownKey
from .bronze import SOURCE_KINDS

_TYPE_NAMES = {
    "string_type": "str",
    "int_type": "int",
    "bool_type": "bool",
    "float_type": "float",
    "dict_type": "dict",
    "model_type": "dict",
    "model_attributes_type": "dict",
    "list_type": "list",
    "tuple_type": "list",
}
#: How a ``Literal`` field names a wrong value, by field; default: ``unknown <field> 'x'; known: ...``.
_LITERAL_WORDING: dict[str, Callable[[str, list[str]], str]] = {
    "mode": lambda value, known: f"unknown trigger mode {value!r}; known: {', '.join(known)}",
    "format": lambda value, known: f"unknown format {value!r}; known: {', '.join(known)}",
    "starting_offsets": lambda _value, known: f"must be {', '.join(known[:-1])} or {known[-1]}",
}


def _field_path(loc: tuple[int | str, ...]) -> list[str]:
    """The dotted field of a pydantic location: no union tags, no list indices but those of a
    list of models (``silver.expectations.2.rule``)."""
    parts: list[str] = []
    previous: int | str | None = None
    for item in loc:
        tag_follows, previous = previous, item
        if isinstance(item, int):
            if parts[-1:] in (["expectations"], ["gold"], ["aggregates"]):
                parts.append(str(item))
            continue
        if parts == ["source"] and item in SOURCE_KINDS:
            continue  # the discriminated union's tag
        if parts[:1] == ["gold"] and len(parts) == 2 and isinstance(tag_follows, int):
            continue  # the tag of a gold table's kind
        parts.append(item)
    return parts


def _describe(error: ErrorDetails) -> str:
    """``dotted.field: message`` (or the message alone for the whole spec)."""
    parts = _field_path(error["loc"])
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "conflux_spec":
        parts += [p for p in str(ctx.get("field", "")).split(".") if p]
        message = str(ctx["message"])
    elif kind == "extra_forbidden" and isinstance(value, UnknownKey):
        message = f"unknown field; allowed: {', '.join(value.allowed)}"
    elif kind == "missing":
        message = "is required"
    elif kind == "union_tag_not_found":
        parts.append("kind")
        message = "is required"
    elif kind == "union_tag_invalid":
        parts.append("kind")
        tag = value.get("kind") if isinstance(value, dict) else None
        known = ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected_tags", ""))))
        message = (
            f"unknown {parts[-2]} kind {tag!r}; known kinds: {known}"
            if isinstance(tag, str)
            else f"expected str, got {type(tag).__name__}"
        )
    elif kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        field = parts[-1] if parts else ""
        wording = _LITERAL_WORDING.get(
            field, lambda v, k: f"unknown {field} {v!r}; known: {', '.join(k)}"
        )
        message = (
            wording(value, expected)
            if isinstance(value, str)
            else f"expected str, got {type(value).__name__}"
        )
    elif kind in _TYPE_NAMES:
        if not parts:
            return f"the spec must be a mapping, got {type(value).__name__}"
        message = f"expected {_TYPE_NAMES[kind]}, got {type(value).__name__}"
    elif kind == "greater_than" and ctx.get("gt") == 0:
        message = "must be a positive integer"
    elif kind == "too_short":
        message = "is empty; give at least one"
    else:
        message = error["msg"]
    return f"{'.'.join(parts)}: {message}" if parts else message

"""The columns a Spark SQL expression of a spec names, found without Spark.

A spec's SQL expressions (``sequence_by``, ``delete_when``, an expectation's ``expr``, a join
side's ``where``) are analysed by Spark only once the flow starts, a minute or more later; a
misspelt column would fail it there. So a spec that loads has each expression's column
references checked against the columns its stage will have.

This is a tokenizer, not a parser: it does not judge the syntax (Spark does, at start), only which
words are column references, by Spark SQL's rules:

- ``a.b.c`` is column ``a`` (``b`` is a field of its struct: only the first part is a column);
  ``a:b`` (a variant path) and ``a[0]`` likewise;
- a backquoted name (`` `from` ``) is a name even if it spells a keyword;
- string literals (``'x'``, ``"x"``: Spark's default reads double quotes as strings, with
  backslash escapes; raw ``r'x'``) name nothing, nor do typed literals (``DATE '2024-01-01'``,
  ``INTERVAL '1' DAY``, ``X'0A'``) or numbers (``1L``, ``1.5e3``, ``0x1F``);
- a word before ``(`` is a function, a word after ``AS`` or ``::`` a type (``DECIMAL(10, 2)``,
  ``STRUCT<a: INT>``) or an alias, a word before ``=>`` a named argument, and the parameters of
  a lambda (``x -> x + 1``, ``(k, v) -> v > 0``) are not columns;
- keywords (``CASE WHEN``, ``IS NOT NULL``, ``TRUE``, interval units, ...) and the functions Spark
  calls without parentheses (``current_date``, ``current_timestamp``, ``user``) are not columns.

When a word could be a keyword or a column (a column named ``year``), it is taken for a keyword,
and a lambda parameter's name is taken as bound in the whole expression: a reference this misses
is Spark's to report at start, but a spec is never refused for a column Spark would find. Struct
fields are not checked (the DDL's nested types are Spark's to parse).

Why not a SQL parser: sqlglot's Spark dialect (30.x) refuses expressions Spark accepts (``values
> 1``, ``a:b.c::int``) and reads ``comment = 1`` as a command naming no column; which words are
columns is all this check needs, and a tokenizer of Spark's lexical rules answers it with no
dependency.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

#: Words that are keywords, interval or date-part units, or functions called without
#: parentheses in Spark SQL expressions (upper case).
_KEYWORDS = frozenset((
    "AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE", "UNKNOWN", "CASE", "WHEN", "THEN", "ELSE",
    "END", "IN", "LIKE", "ILIKE", "RLIKE", "REGEXP", "BETWEEN", "ESCAPE", "DISTINCT", "FROM", "FOR",
    "BOTH", "LEADING", "TRAILING", "PLACING", "DIV", "INTERVAL", "TO", "ANY", "ALL", "SOME",
    "OVER", "PARTITION", "BY", "ORDER", "ASC", "DESC", "NULLS", "FIRST", "LAST", "ROWS", "RANGE",
    "UNBOUNDED", "PRECEDING", "FOLLOWING", "CURRENT", "ROW", "WITHIN", "GROUP", "WHERE", "IGNORE",
    "RESPECT", "COLLATE",
    "YEAR", "YEARS", "QUARTER", "QUARTERS", "MONTH", "MONTHS", "WEEK", "WEEKS", "DAY", "DAYS",
    "DAYOFYEAR", "DAYOFWEEK", "HOUR", "HOURS", "MINUTE", "MINUTES", "SECOND", "SECONDS",
    "MILLISECOND", "MILLISECONDS", "MICROSECOND", "MICROSECONDS",
    "CURRENT_DATE", "CURRENT_TIMESTAMP", "CURRENT_TIME", "CURRENT_USER", "USER", "SESSION_USER",
))  # fmt: skip
#: Words after which the next word is not a column: a type or an alias (``AS``), a window's name
#: (``OVER w``), a collation (``COLLATE UTF8_LCASE``).
_NAMES_NEXT = ("AS", "OVER", "COLLATE")


class _Kind(Enum):
    SPACE = "space"
    STRING = "string"
    QUOTED = "quoted"
    NUMBER = "number"
    WORD = "word"
    SYMBOL = "symbol"


_TOKEN = re.compile(
    r"""
    (?P<space>\s+|--[^\n]*|/\*.*?(?:\*/|$))
    |(?P<string>[rR](?:'[^']*(?:'|$)|"[^"]*(?:"|$))
        |[xX]?(?:'(?:\\.|[^'\\])*(?:'|$)|"(?:\\.|[^"\\])*(?:"|$)))
    |(?P<quoted>`(?:[^`]|``)*(?:`|$))
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\w*)
    |(?P<word>[^\W\d]\w*)
    |(?P<symbol>->|=>|::|.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class _Token:
    kind: _Kind
    text: str

    @property
    def name(self) -> str:
        """A word or a backquoted name as Spark reads it (backquotes off, doubled ones single)."""
        if self.kind is _Kind.QUOTED:
            return self.text[1:].removesuffix("`").replace("``", "`")
        return self.text

    @property
    def is_name(self) -> bool:
        return self.kind in (_Kind.WORD, _Kind.QUOTED)

    def keyword(self) -> str:
        """The word in upper case ("" for anything else: a backquoted name is never a keyword)."""
        return self.text.upper() if self.kind is _Kind.WORD else ""


@dataclass(frozen=True)
class ColumnReference:
    """A name an expression refers to: a column, then the struct fields it reads (``a.b``)."""

    parts: tuple[str, ...]

    @property
    def column(self) -> str:
        return self.parts[0]

    def __str__(self) -> str:
        return ".".join(self.parts)


def _tokens(expression: str) -> list[_Token]:
    """The tokens of ``expression``, without whitespace and comments."""
    tokens = []
    for match in _TOKEN.finditer(expression):
        kind = _Kind(match.lastgroup)
        if kind is not _Kind.SPACE:
            tokens.append(_Token(kind, match.group()))
    return tokens


def _lambda_parameters(tokens: list[_Token]) -> set[str]:
    """The (lower-case) names bound by the lambdas of an expression: ``x -> ...``,
    ``(x, y) -> ...``."""
    bound: set[str] = set()
    for index, token in enumerate(tokens):
        if token.text != "->" or index == 0:
            continue
        before = tokens[index - 1]
        if before.is_name:
            bound.add(before.name.lower())
        elif before.text == ")":
            start = index - 2
            while start >= 0 and tokens[start].text != "(":
                start -= 1
            bound.update(t.name.lower() for t in tokens[start + 1 : index - 1] if t.is_name)
    return bound


def _skip_type(tokens: list[_Token], index: int) -> int:
    """The index after the type (or alias) starting at ``index``: a word, then its parameters in
    balanced ``(...)`` or ``<...>`` (``DECIMAL(10, 2)``, ``MAP<STRING, ARRAY<INT>>``)."""
    generic = index < len(tokens) and tokens[index].keyword() in ("ARRAY", "MAP", "STRUCT")
    index += 1
    opening = tokens[index].text if index < len(tokens) else ""
    if opening == "(" or (generic and opening == "<"):
        closing = ")" if opening == "(" else ">"
        depth = 0
        for position in range(index, len(tokens)):
            depth += {opening: 1, closing: -1}.get(tokens[position].text, 0)
            if depth == 0:
                return position + 1
        return len(tokens)
    return index


def _names_a_column(tokens: list[_Token], index: int, bound: set[str]) -> bool:
    """Whether the name at ``index`` is a column (the first part of a reference)."""
    token = tokens[index]
    before = tokens[index - 1].text if index else ""
    after = tokens[index + 1] if index + 1 < len(tokens) else None
    if not token.is_name or token.keyword() in _KEYWORDS or token.name.lower() in bound:
        return False
    if before in (".", ":"):
        return False  # a struct field or a variant path
    if after is not None and (after.text in ("(", "=>", "->") or after.kind is _Kind.STRING):
        return False  # a function, a named argument, a lambda parameter, a typed literal
    # EXTRACT(<field> FROM ...): a date part, such as DOW or YRS
    return not (before == "(" and index >= 2 and tokens[index - 2].keyword() == "EXTRACT")


def column_references(expression: str) -> tuple[ColumnReference, ...]:
    """The column references of a Spark SQL expression, in order of appearance (module doc)."""
    tokens = _tokens(expression)
    bound = _lambda_parameters(tokens)
    references: list[ColumnReference] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.keyword() in _NAMES_NEXT or token.text == "::":
            index = _skip_type(tokens, index + 1)
            continue
        if not _names_a_column(tokens, index, bound):
            index += 1
            continue
        parts = [token.name]
        index += 1
        while index + 1 < len(tokens) and tokens[index].text == "." and tokens[index + 1].is_name:
            parts.append(tokens[index + 1].name)
            index += 2
        references.append(ColumnReference(tuple(parts)))
    return tuple(references)


def unknown_references(expression: str, known: tuple[str, ...]) -> list[ColumnReference]:
    """The references of ``expression`` to columns not in ``known`` (compared without case, as
    Spark resolves them), each column once."""
    names = {name.lower() for name in known}
    unknown: dict[str, ColumnReference] = {}
    for reference in column_references(expression):
        if reference.column.lower() not in names:
            unknown.setdefault(reference.column.lower(), reference)
    return list(unknown.values())


def reference_problem(
    expression: str,
    columns: Sequence[str],
    metadata: Sequence[str],
    *,
    of: str = "schema",
    note: str = "",
) -> str | None:
    """What is wrong with the column references of ``expression``, which may name ``columns``
    (those of ``of``: the schema, a flow's events) and ``metadata`` (``note`` says more of them),
    or None when every reference is one of them."""
    unknown = unknown_references(expression, (*columns, *metadata))
    if not unknown:
        return None
    text = expression.strip()
    if len(unknown) == 1 and unknown[0].parts == (text,):
        subject = f"{text!r} is"
    else:
        names = ", ".join(repr(r.column) for r in unknown)
        one = len(unknown) == 1
        subject = (
            f"{text!r} names column{'' if one else 's'} {names}, which {'is' if one else 'are'}"
        )
    hints = [hint for r in unknown if (hint := _hint(r, (*columns, *metadata)))]
    return (
        f"{subject} neither a column of {of} (columns of {of}: {', '.join(columns)}) nor a "
        f"metadata column ({', '.join(metadata)}{note}); {''.join(h + '; ' for h in hints)}"
        "give a column or an expression over them"
    )


def _hint(reference: ColumnReference, known: Sequence[str]) -> str:
    """A likely meant column: Debezium's ``source.lsn`` is ``_source_lsn``; else a close name."""
    parts = reference.parts
    if parts[0].lower() == "source" and len(parts) > 1 and f"_source_{parts[1]}" in known:
        return f"Debezium's {reference} is the metadata column _source_{parts[1]}"
    close = difflib.get_close_matches(reference.column, known, n=1, cutoff=0.8)
    return f"{reference.column!r} is close to column {close[0]!r}" if close else ""

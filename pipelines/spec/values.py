"""Value types of spec fields: identifiers, topics, intervals, durations, paths, cron, owners, tags.

Each is a type with its validator and its JSON Schema (the pattern an editor checks), so a value
is checked once where its type is declared, and nothing user-written reaches SQL unchecked.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlparse

from pydantic import AfterValidator, BeforeValidator, StrictStr, WithJsonSchema

from .base import _error

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
INTERVAL_RE = re.compile(r"^\d+(\.\d+)?\s*(millisecond|second|minute|hour)s?$")
#: ``silver.current.deleted_key_retention``: like a trigger interval, in whole units, days allowed.
RETENTION_RE = re.compile(r"^\d+\s*(second|minute|hour|day)s?$")
#: ``silver.transform``: ``package.module:function``.
TRANSFORM_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
#: ``maintenance.schedule``: a five-field cron expression.
CRON_RE = re.compile(r"^\s*(\S+\s+){4}\S+\s*$")


def _identifier(value: str) -> str:
    if not IDENTIFIER_RE.match(value):
        raise _error(f"{value!r} is not a valid identifier (letters, digits, _)")
    return value


def _topic(value: str) -> str:
    if not TOPIC_RE.match(value):
        raise _error(f"{value!r} is not a valid Kafka topic name")
    return value


def _interval(value: str) -> str:
    if not INTERVAL_RE.match(value):
        raise _error(f"{value!r} is not an interval such as '5 seconds'")
    return value


def _retention(value: str) -> str:
    if not RETENTION_RE.match(value):
        raise _error(f"{value!r} is not a retention such as '7 days' (seconds to days)")
    return value


def _local_path(value: str) -> str:
    """A landing folder is read with the local filesystem's listing (and files are moved out of
    it): refuse a URI instead of misreading it."""
    if "://" in value:
        raise _error(
            f"{value!r} is a URI; a landing folder is a local or mounted path so far (mount the "
            "bucket, e.g. with a FUSE or NFS gateway, and give its path)"
        )
    return value


def _table_location(value: str) -> str:
    """A table's location: a path, or a URI on a store Conflux can commit to exactly once (the
    rule of :func:`pipelines.location.normalize`, checked here to name the spec's field)."""
    parsed = urlparse(value)
    scheme = parsed.scheme
    if scheme not in ("", "file", "s3a", "s3") or (scheme in ("s3a", "s3") and "://" not in value):
        raise _error(
            f"{value!r}: Conflux keeps tables on the local disk (a path) or on an S3-compatible "
            f"store (s3a://bucket/prefix), not on {scheme or value.partition(':')[0]}:"
        )
    if scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise _error(f"{value!r}: a file: URI names a local path (file:///path), not a host")
    if scheme in ("s3a", "s3"):
        bucket, _, key = value.partition("://")[2].partition("/")
        if not bucket:
            raise _error(f"{value!r} names no bucket; give s3a://bucket/prefix")
        if not key.strip("/"):
            raise _error(
                f"{value!r} is a bucket's root; give the table a prefix of its own "
                "(s3a://bucket/prefix): its side tables sit beside it"
            )
    return value


def _transform(value: str) -> str:
    if not TRANSFORM_RE.match(value):
        raise _error(
            f"{value!r} is not a function reference; give `package.module:function`, "
            "e.g. `transforms.customers:mask_emails`"
        )
    return value


def _cron(value: str) -> str:
    if not CRON_RE.match(value):
        raise _error(f"{value!r} is not a cron expression of five fields, e.g. `0 3 * * *`")
    return value


def _sql_fragment(value: str) -> str:
    if not value.strip():
        raise _error("is empty; give a column or a SQL expression, or leave the field out")
    if ";" in value:
        raise _error(f"{value!r} contains ';': give one SQL expression, not statements")
    return value


def _string_map(value: Any) -> Any:
    """YAML option values may be numbers or booleans: Spark options are strings."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    return value


def _string(pattern: re.Pattern[str] | None = None, **extra: Any) -> WithJsonSchema:
    schema: dict[str, Any] = {"type": "string", **extra}
    if pattern is not None:
        schema["pattern"] = pattern.pattern
    return WithJsonSchema(schema)


Identifier = Annotated[StrictStr, AfterValidator(_identifier), _string(IDENTIFIER_RE)]
Topic = Annotated[StrictStr, AfterValidator(_topic), _string(TOPIC_RE)]
Interval = Annotated[StrictStr, AfterValidator(_interval), _string(INTERVAL_RE)]
Retention = Annotated[StrictStr, AfterValidator(_retention), _string(RETENTION_RE)]
LocalPath = Annotated[StrictStr, AfterValidator(_local_path), _string()]
#: A table's location: a path (absolute, or relative to the runtime folder) or an s3a:// URI.
TableLocation = Annotated[StrictStr, AfterValidator(_table_location), _string()]
TransformRef = Annotated[StrictStr, AfterValidator(_transform), _string(TRANSFORM_RE)]
Cron = Annotated[StrictStr, AfterValidator(_cron), _string(CRON_RE)]
SqlFragment = Annotated[StrictStr, AfterValidator(_sql_fragment), _string(minLength=1)]
#: A window length, a lateness or a skew: whole units, seconds to days.
DURATION_RE = RETENTION_RE
_DURATION_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def duration_seconds(text: str) -> int:
    """Seconds in a spec duration such as ``10 minutes`` (validated by :data:`DURATION_RE`)."""
    match = re.match(r"^(\d+)\s*(second|minute|hour|day)s?$", text)
    assert match is not None, f"not a duration: {text!r}"
    return int(match[1]) * _DURATION_UNITS[match[2]]


def _duration(value: str) -> str:
    if not DURATION_RE.match(value):
        raise _error(f"{value!r} is not a duration such as '10 minutes' (seconds to days)")
    return value


Duration = Annotated[StrictStr, AfterValidator(_duration), _string(DURATION_RE)]


OWNER_RE = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")
TAG_RE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


def _owner(value: str) -> str:
    if not OWNER_RE.match(value):
        raise _error(f"{value!r} is neither an email nor `team:<name>`")
    return value


def _tags(value: dict[str, str]) -> dict[str, str]:
    for key, tag in value.items():
        if not key or not TAG_RE.match(key) or not TAG_RE.match(tag):
            raise _error(
                f"tag {key!r}: {tag!r} is not a Dagster tag: keys and values of letters, "
                "digits, `_`, `-`, `.`, at most 63 characters (keys not empty)"
            )
    return value


Owner = Annotated[StrictStr, AfterValidator(_owner), _string(OWNER_RE)]
StringMap = Annotated[
    dict[str, str],
    BeforeValidator(_string_map),
    WithJsonSchema(
        {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
    ),
]
TagMap = Annotated[StringMap, AfterValidator(_tags)]


def _days(interval: str) -> float:
    """Days in a Delta interval property (``interval 30 days``); unknown units count as long."""
    match = re.match(r"^\s*(?:interval\s+)?(\d+)\s*(second|minute|hour|day|week)s?\s*$", interval)
    if match is None:
        return float("inf")  # Delta validates the syntax when the property is set
    seconds = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
    return int(match[1]) * seconds[match[2]] / 86400

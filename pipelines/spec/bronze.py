"""The bronze part of a spec: the source (Kafka or files), the bronze target table, the trigger."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from .base import _error, _Model
from .columns import BRONZE_PARTITION_COLUMNS
from .values import (
    Cron,
    Duration,
    Identifier,
    Interval,
    LocalPath,
    StringMap,
    TableLocation,
    Topic,
    duration_seconds,
)

FILE_FORMATS = ("json", "csv", "parquet")
TRIGGER_MODES = ("available_now", "continuous")


def _require_kind(schema: dict[str, Any]) -> None:
    """``kind`` has a default for Python callers, but a YAML source must name its kind."""
    schema["required"] = ["kind", *[k for k in schema.get("required", []) if k != "kind"]]


class KafkaSource(_Model):
    """Read one or several Kafka topics (a list, or a subscribe pattern)."""

    model_config = ConfigDict(json_schema_extra=_require_kind)

    kind: Literal["kafka"] = Field(default="kafka", description="The kind of source: `kafka`.")
    topics: tuple[Topic, ...] = Field(
        default=(), description="Topics to read; give exactly one of `topics` or `pattern`."
    )
    pattern: StrictStr | None = Field(
        default=None, description="A Java regex of topics to subscribe to, instead of `topics`."
    )
    starting_offsets: Literal["earliest", "latest", "timestamp"] = Field(
        default="earliest",
        description="Where a new flow (no checkpoint yet) starts reading: `earliest`, `latest`, "
        "or `timestamp` (then give `starting_timestamp_ms`).",
    )
    starting_timestamp_ms: StrictInt | None = Field(
        default=None,
        description="Epoch milliseconds to start from; required exactly when "
        "`starting_offsets` is `timestamp`.",
    )
    max_offsets_per_trigger: StrictInt | None = Field(
        default=None, gt=0, description="Upper bound of records per micro-batch (all partitions)."
    )
    fail_on_data_loss: StrictBool = Field(
        default=True,
        description="Fail when offsets the checkpoint expects are gone (retention, topic "
        "recreated) instead of skipping them.",
    )
    bootstrap_servers: StrictStr | None = Field(
        default=None,
        description="Kafka bootstrap servers; default: the settings' bootstrap servers.",
    )
    options: StringMap = Field(
        default_factory=dict,
        description="Kafka client options passed through to Spark; only `kafka.*` keys.",
    )
    unavailable_for: Duration = Field(
        default="30 minutes",
        description="How long a flow waits for an unreachable broker (its query waits inside "
        "the running application, probing the broker with backoff, state `waiting for source`, "
        "then starts again from its checkpoint) before it fails with reason "
        "`source_unavailable`, which no supervisor restarts: long enough for a rolling restart "
        "or a maintenance window. 0 fails at once with `source_error` (then restarted as a "
        "crash).",
    )

    @field_validator("options")
    @classmethod
    def _kafka_options_only(cls, options: dict[str, str]) -> dict[str, str]:
        bad = [k for k in options if not k.startswith("kafka.")]
        if bad:
            raise _error(f"only kafka.* client options pass through, not {bad}")
        _check_client_timeouts(options)
        return options

    @model_validator(mode="after")
    def _check(self) -> KafkaSource:
        if bool(self.topics) == bool(self.pattern):
            raise _error("give exactly one of topics (a non-empty list) or pattern", "topics")
        if (self.starting_offsets == "timestamp") != (self.starting_timestamp_ms is not None):
            raise _error(
                "is required exactly when starting_offsets is timestamp", "starting_timestamp_ms"
            )
        return self


#: The Kafka client's own default of ``request.timeout.ms`` (admin client and consumer).
KAFKA_REQUEST_TIMEOUT_MS = 30_000


def _check_client_timeouts(options: dict[str, str]) -> None:
    """The Kafka client refuses ``default.api.timeout.ms`` below ``request.timeout.ms`` when
    Spark creates it, and the query then fails at its start as a source error: refused here."""
    api, request = (
        options.get("kafka.default.api.timeout.ms"),
        options.get("kafka.request.timeout.ms"),
    )
    try:
        api_ms = int(api) if api is not None else None
        request_ms = int(request) if request is not None else KAFKA_REQUEST_TIMEOUT_MS
    except ValueError as exc:
        raise _error(f"Kafka timeouts are whole milliseconds: {exc}") from exc
    if api_ms is not None and api_ms < request_ms:
        raise _error(
            f"kafka.default.api.timeout.ms = {api_ms} is below kafka.request.timeout.ms = "
            f"{request_ms}{'' if request is not None else ' (the Kafka default)'}, which the "
            "Kafka client refuses: set kafka.request.timeout.ms to at most "
            f"{api_ms} too, or raise kafka.default.api.timeout.ms"
        )


class FileSource(_Model):
    """Read files that land in a folder (JSON lines, CSV with a header, or Parquet)."""

    model_config = ConfigDict(json_schema_extra=_require_kind)

    kind: Literal["files"] = Field(default="files", description="The kind of source: `files`.")
    path: LocalPath = Field(
        description="The landing folder: absolute, or relative to the runtime folder."
    )
    format: Literal["json", "csv", "parquet"] = Field(
        default="json",
        description="File format: `json` (JSON lines), `csv` (with a header), `parquet`.",
    )
    max_files_per_trigger: StrictInt | None = Field(
        default=None, gt=0, description="Upper bound of files per micro-batch."
    )
    archive_dir: StrictStr | None = Field(
        default=None,
        description="Move processed files into this folder (outside the landing folder).",
    )
    options: StringMap = Field(
        default_factory=dict,
        description="Spark reader options of the format (e.g. `sep` for CSV).",
    )


Source = KafkaSource | FileSource
#: The ``kind`` of each source model, e.g. ``("kafka", "files")``.
SOURCE_KINDS: tuple[str, ...] = tuple(
    str(model.model_fields["kind"].default) for model in get_args(Source)
)


#: Folders beside the bronze checkpoint (``<checkpoints>/<flow>/<bronze table>``): stage checkpoints.
RESERVED_CHECKPOINT_NAMES = ("silver", "gold")


class Target(_Model):
    """The bronze Delta table a flow writes."""

    table: Identifier = Field(description="Name of the bronze table.")
    path: TableLocation | None = Field(
        default=None,
        description=(
            "Location of the table: a path (absolute, or relative to the runtime folder) or "
            "`s3a://bucket/prefix`; default: `<lake>/bronze/<table>`."
        ),
    )
    partition_by: tuple[Identifier, ...] = Field(
        default=(),
        description="Partition columns, among: " + ", ".join(BRONZE_PARTITION_COLUMNS) + ".",
    )

    @field_validator("table")
    @classmethod
    def _not_a_stage_folder(cls, table: str) -> str:
        if table in RESERVED_CHECKPOINT_NAMES:
            raise _error(
                f"{table!r} is the name of a folder of the flow's checkpoints (the bronze "
                "checkpoint is named after the table): choose another name"
            )
        return table

    @field_validator("partition_by")
    @classmethod
    def _bronze_columns(cls, columns: tuple[str, ...]) -> tuple[str, ...]:
        for column in columns:
            if column not in BRONZE_PARTITION_COLUMNS:
                raise _error(
                    f"bronze can be partitioned by {', '.join(BRONZE_PARTITION_COLUMNS)}, "
                    f"not {column!r}"
                )
        return columns


class Trigger(_Model):
    """When micro-batches run."""

    mode: Literal["available_now", "continuous"] = Field(
        default="available_now",
        description="`available_now`: read what is there, then stop (incremental runs); "
        "`continuous`: run until stopped, one micro-batch per `interval`.",
    )
    interval: Interval = Field(
        default="5 seconds",
        description="Micro-batch interval of a continuous flow, e.g. `5 seconds`.",
    )
    schedule: Cron | None = Field(
        default=None,
        description="When an `available_now` flow runs by itself (cron, UTC), e.g. `*/15 * * * *`: "
        "the Dagster schedule `run_<flow>_schedule`; default: only when launched.",
    )
    stale_after: Duration = Field(
        default="2 minutes",
        description="A continuous flow whose Spark application has reported nothing (no batch, "
        "no idle heartbeat) for this long is unhealthy (its `stream_health` check fails). "
        "Spark reports an idle query every 10 seconds, so keep it well above that.",
    )
    max_restarts: Annotated[StrictInt, Field(ge=0)] = Field(
        default=5,
        description="A continuous flow whose Spark application dies is started again, from its "
        "checkpoint, up to this many times per run (0: never).",
    )
    restart_delay: Duration = Field(
        default="10 seconds",
        description="Wait before the first restart; Dagster's exponential backoff waits 1, 3, 7, "
        "... times this before each further one.",
    )

    @model_validator(mode="after")
    def _check_schedule(self) -> Trigger:
        if self.schedule is not None and self.mode == "continuous":
            raise _error(
                "a continuous flow runs until stopped: a schedule starts `available_now` runs; "
                "set `mode: available_now` or leave `schedule` out",
                "schedule",
            )
        least = max(30.0, 2 * self.interval_seconds() + 10)
        if duration_seconds(self.stale_after) < least:
            raise _error(
                f"{self.stale_after!r} is shorter than {least:.0f} seconds: an idle query reports "
                f"once per trigger (interval {self.interval}) and at most every 10 seconds, so a "
                "healthy idle flow would look stale; give at least twice the interval plus 10 "
                "seconds, and more than your longest micro-batch",
                "stale_after",
            )
        return self

    def interval_seconds(self) -> float:
        """Seconds in :attr:`interval` (validated by :data:`INTERVAL_RE`)."""
        match = re.match(r"^(\d+(?:\.\d+)?)\s*(millisecond|second|minute|hour)s?$", self.interval)
        assert match is not None, self.interval
        unit = {"millisecond": 0.001, "second": 1, "minute": 60, "hour": 3600}[match[2]]
        return float(match[1]) * unit

"""What the data plane tells the control plane: one frozen dataclass per kind of message.

The runner (Spark, no Dagster) reports through these types, serialized with ``to_json()``: as
Dagster Pipes custom messages, as the ``conflux.progress`` lines on stdout, and (the last batch)
in each flow's ``_status.json`` (:mod:`pipelines.status`). The control plane (``assets/``) and
``conflux status`` read them back with :func:`parse_message` / the kinds' ``parse`` into the
same types, and from then on use attributes. Kinds:

* :class:`BatchCommitted` (``"batch"``): a micro-batch committed, every table write it made
  (:class:`TableWrite`; history, deleted keys, late rows included) and its check results
  (:class:`BatchQuality` for silver, :class:`GoldQuality` for a gold split);
* :class:`StageStarted` (``"stage_started"``): a stage's streaming query started;
* :class:`FlowStopped` (``"flow_stopped"``): a flow stopped, and why (:class:`StopReason`, set
  where the stop was caused, never read back from Spark's error text);
* :class:`ErrorReported` (``"error"``): an error as the user reads it.

The JSON shapes are those earlier versions wrote: a message or a ``_status.json`` written by the
previous version parses (fields it did not have take their defaults), and for a message of this
version ``parse(m.to_json()) == m``. This module imports nothing of Spark or Dagster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from pipelines.catalog.roles import BRONZE_STAGE, SILVER_STAGE, gold_stage, is_gold_stage
from pipelines.timestamps import iso_utc

#: A JSON object as :func:`json.loads` returns it.
JsonObject = dict[str, Any]
T = TypeVar("T")


class MessageError(ValueError):
    """A message or status file this version cannot read; the text names the field."""


@dataclass(frozen=True)
class _Fields:
    """Reads the fields of one JSON object, naming the object and the field in every error."""

    data: Mapping[str, Any]
    where: str

    def required(self, name: str, convert: Callable[[Any], T]) -> T:
        value = self.data.get(name)
        if value is None:
            raise MessageError(
                f"{self.where}: field {name!r} is missing; was it written by another version of "
                "Conflux? (its fields: " + ", ".join(sorted(self.data)) + ")"
            )
        return self._convert(name, value, convert)

    def get(self, name: str, convert: Callable[[Any], T], default: T) -> T:
        value = self.data.get(name)
        return default if value is None else self._convert(name, value, convert)

    def optional(self, name: str, convert: Callable[[Any], T]) -> T | None:
        value = self.data.get(name)
        return None if value is None else self._convert(name, value, convert)

    def _convert(self, name: str, value: Any, convert: Callable[[Any], T]) -> T:
        try:
            return convert(value)
        except (TypeError, ValueError) as exc:
            raise MessageError(f"{self.where}: field {name!r} = {value!r}: {exc}") from exc

    def object(self, name: str) -> Mapping[str, Any] | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, Mapping):
            raise MessageError(f"{self.where}: field {name!r} = {value!r} is not a JSON object")
        return value

    def objects(self, name: str) -> list[Mapping[str, Any]]:
        value = self.data.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise MessageError(f"{self.where}: field {name!r} = {value!r} is not a list of objects")
        return value


def _strict_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError("not an integer")
    return int(value)


@dataclass(frozen=True)
class TableWrite:
    """What one idempotent write of a micro-batch did to one table: the version that holds the
    batch's transaction id and the rows it added or changed, or that Delta ``skipped`` it (a
    replay). ``role`` is the table's id in the flow (:func:`pipelines.catalog.roles.role_id`)."""

    table: str
    role: str
    version: int | None
    rows: int
    skipped: bool

    def to_dict(self) -> JsonObject:
        return {
            "table": self.table,
            "role": self.role,
            "version": self.version,
            "rows": self.rows,
            "skipped": self.skipped,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> TableWrite:
        read = _Fields(data, "a batch's table write")
        return cls(
            table=read.required("table", str),
            role=read.required("role", str),
            version=read.optional("version", _strict_int),
            rows=read.get("rows", _strict_int, 0),
            skipped=read.get("skipped", bool, False),
        )


#: The row counts of a silver batch's quality report (:class:`BatchQuality`).
QUALITY_COUNTS = (
    "rows_in", "events", "quarantined", "ignored", "passed", "warned", "dropped",
    "schema_mismatches", "rescued",
)  # fmt: skip


@dataclass(frozen=True)
class ExpectationCount:
    """One expectation's outcome in one batch."""

    name: str
    action: str
    failed: int
    expectation: str

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name,
            "action": self.action,
            "failed": self.failed,
            "expectation": self.expectation,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ExpectationCount:
        read = _Fields(data, "an expectation's outcome")
        return cls(
            name=read.required("name", str),
            action=read.get("action", str, ""),
            failed=read.get("failed", _strict_int, 0),
            expectation=read.get("expectation", str, ""),
        )


@dataclass(frozen=True)
class BatchQuality:
    """Where the rows of one silver batch went, and what its expectations found.

    ``rows_in`` = ``events`` + ``quarantined`` + ``ignored``: every bronze row is an event handed
    to the silver writers, a quarantined row (parse failure, missing key, null sequence, a
    ``drop`` expectation) or an ignored Debezium tombstone. Of the events, ``passed`` failed no
    expectation and ``warned`` failed a ``warn`` one; ``dropped`` rows were quarantined by a
    ``drop`` expectation; ``schema_mismatches`` of the quarantined rows changed schema in a way
    not taken in (:mod:`pipelines.silver.schema_changes`: a value of another type than declared,
    a declared column missing, undeclared fields under ``new_columns: quarantine``); ``rescued``
    events keep undeclared fields in ``_rescued_data``; ``written`` is ``events`` after the
    transform (which may filter); ``columns_added`` were evolved into the tables by this batch.
    """

    rows_in: int
    events: int
    quarantined: int
    ignored: int
    passed: int
    warned: int
    dropped: int
    schema_mismatches: int
    rescued: int
    written: int
    expectations: tuple[ExpectationCount, ...] = field(default=())
    columns_added: tuple[str, ...] = field(default=())

    def to_dict(self) -> JsonObject:
        data: JsonObject = {name: getattr(self, name) for name in QUALITY_COUNTS}
        data["written"] = self.written
        data["expectations"] = [e.to_dict() for e in self.expectations]
        data["columns_added"] = list(self.columns_added)
        return data

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> BatchQuality:
        """Counts a runner of an earlier version did not report are 0 (``written``: ``events``)."""
        read = _Fields(data, "a silver batch's quality")
        counts = {name: read.get(name, _strict_int, 0) for name in QUALITY_COUNTS}
        return cls(
            **counts,
            written=read.get("written", _strict_int, counts["events"]),
            expectations=tuple(ExpectationCount.parse(e) for e in read.objects("expectations")),
            columns_added=tuple(str(c) for c in data.get("columns_added") or ()),
        )


#: The row counts of a gold split batch's quality report (:class:`GoldQuality`).
GOLD_COUNTS = (
    "rows_in", "on_time", "late", "quarantined", "filtered", "null_event_time",
    "future_event_time",
)  # fmt: skip


@dataclass(frozen=True)
class GoldQuality:
    """Where the rows of one gold split batch went, and the watermark that judged them.

    ``rows_in`` = ``on_time`` + ``late`` + ``quarantined`` + ``filtered``; ``next_watermark`` and
    ``max_event_time`` are Conflux's watermark log after the batch (ISO times, None before any
    event time). ``watermarks``: what the split reports of the watermark each row was judged by
    (``watermark``; a join also ``watermark_<side>`` and ``join_running``).
    """

    rows_in: int
    on_time: int
    late: int
    quarantined: int
    filtered: int
    null_event_time: int
    future_event_time: int
    next_watermark: str | None = None
    max_event_time: str | None = None
    watermarks: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        data: JsonObject = {name: getattr(self, name) for name in GOLD_COUNTS}
        data.update(self.watermarks)
        data["next_watermark"] = self.next_watermark
        data["max_event_time"] = self.max_event_time
        return data

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> GoldQuality:
        read = _Fields(data, "a gold split batch's quality")
        known = {*GOLD_COUNTS, "next_watermark", "max_event_time"}
        return cls(
            **{name: read.get(name, _strict_int, 0) for name in GOLD_COUNTS},
            next_watermark=read.optional("next_watermark", str),
            max_event_time=read.optional("max_event_time", str),
            watermarks={k: v for k, v in data.items() if k not in known},
        )


Quality = BatchQuality | GoldQuality


def gold_table_of(stage: str) -> str | None:
    """The gold table of a gold stage (:func:`pipelines.catalog.roles.gold_stage`), else None."""
    return stage.split(".")[1] if is_gold_stage(stage) else None


def _quality(stage: str, data: Mapping[str, Any] | None) -> Quality | None:
    if data is None:
        return None
    if stage == SILVER_STAGE:
        return BatchQuality.parse(data)
    if is_gold_stage(stage):
        return GoldQuality.parse(data)
    raise MessageError(f"a batch message of stage {stage!r} has a quality report: no stage has")


@dataclass(frozen=True)
class BatchCommitted:
    """A committed micro-batch of one stage of a flow: Spark's progress figures (input rows,
    rates, duration, the source's end and latest offsets and the lag between them, the state of
    a stateful query) and what its Delta writes really did (``writes``: every table; the stage's
    main table's version and rows in ``delta_version`` / ``rows_added``; ``replayed``: Delta
    skipped every write as a replay)."""

    flow: str
    stage: str
    batch_id: int
    input_rows: int
    rows_added: int
    replayed: bool
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    end_offsets: Any
    latest_offsets: Any
    lag: int | None
    partition_lag: dict[str, int] | None
    delta_version: int | None
    timestamp: str
    writes: tuple[TableWrite, ...] = ()
    #: The batch's check results: silver's row accounting and expectations, a gold split's.
    quality: Quality | None = None
    #: A query reading a Delta table (silver from bronze, gold from the events): table versions
    #: between the batch's end and the newest version it saw; Kafka sources have ``lag``.
    lag_versions: int | None = None
    #: Stateful queries (gold): the batch's watermark and per state operator its rows, memory,
    #: state-store commit time and rows dropped by the watermark.
    state: JsonObject | None = None

    TYPE = "batch"

    @property
    def is_bronze(self) -> bool:
        return self.stage == BRONZE_STAGE

    @property
    def is_silver(self) -> bool:
        return self.stage == SILVER_STAGE

    @property
    def gold_table(self) -> str | None:
        """The gold table whose split or stateful query wrote the batch (None: not gold)."""
        return gold_table_of(self.stage)

    @property
    def is_gold_split(self) -> bool:
        table = self.gold_table
        return table is not None and self.stage == gold_stage(table, split=True)

    def to_json(self) -> JsonObject:
        return {
            "type": self.TYPE,
            "flow": self.flow,
            "stage": self.stage,
            "batch_id": self.batch_id,
            "input_rows": self.input_rows,
            "rows_added": self.rows_added,
            "replayed": self.replayed,
            "input_rows_per_second": self.input_rows_per_second,
            "processed_rows_per_second": self.processed_rows_per_second,
            "batch_duration_ms": self.batch_duration_ms,
            "end_offsets": self.end_offsets,
            "latest_offsets": self.latest_offsets,
            "lag": self.lag,
            "partition_lag": None if self.partition_lag is None else dict(self.partition_lag),
            "delta_version": self.delta_version,
            "timestamp": self.timestamp,
            "writes": [w.to_dict() for w in self.writes],
            "quality": None if self.quality is None else self.quality.to_dict(),
            "lag_versions": self.lag_versions,
            "state": self.state,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> BatchCommitted:
        """A batch message or a status file's ``last_batch``; a runner from before silver wrote
        no ``stage`` (bronze), no ``writes``, no ``quality``."""
        read = _Fields(data, "a batch message")
        stage = read.get("stage", str, BRONZE_STAGE)
        partition_lag = read.object("partition_lag")
        state = read.object("state")
        return cls(
            flow=read.required("flow", str),
            stage=stage,
            batch_id=read.required("batch_id", _strict_int),
            input_rows=read.get("input_rows", _strict_int, 0),
            rows_added=read.get("rows_added", _strict_int, 0),
            replayed=read.get("replayed", bool, False),
            input_rows_per_second=read.get("input_rows_per_second", float, 0.0),
            processed_rows_per_second=read.get("processed_rows_per_second", float, 0.0),
            batch_duration_ms=read.get("batch_duration_ms", _strict_int, 0),
            end_offsets=data.get("end_offsets"),
            latest_offsets=data.get("latest_offsets"),
            lag=read.optional("lag", _strict_int),
            partition_lag=None
            if partition_lag is None
            else {str(k): _strict_int(v) for k, v in partition_lag.items()},
            delta_version=read.optional("delta_version", _strict_int),
            timestamp=read.get("timestamp", str, ""),
            writes=tuple(TableWrite.parse(w) for w in read.objects("writes")),
            quality=_quality(stage, read.object("quality")),
            lag_versions=read.optional("lag_versions", _strict_int),
            state=None if state is None else dict(state),
        )


@dataclass(frozen=True)
class StageStarted:
    """A stage of a flow started its streaming query ``query``."""

    flow: str
    stage: str
    query: str

    TYPE = "stage_started"

    def to_json(self) -> JsonObject:
        return {"type": self.TYPE, "flow": self.flow, "stage": self.stage, "query": self.query}

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> StageStarted:
        read = _Fields(data, "a stage-started message")
        return cls(
            read.required("flow", str), read.required("stage", str), read.required("query", str)
        )


class StopReason(StrEnum):
    """Why a flow stopped. Set where the stop was caused: the stage that raised the error, the
    lease guard, the stop request, or (a failure inside Spark) the type of what Spark threw."""

    #: An ``available_now`` run caught up with its source and ended.
    FINISHED = "finished"
    #: A stop was requested (SIGTERM, ``conflux stop``, a Dagster run terminated).
    STOPPED_ON_REQUEST = "stopped_on_request"
    #: A ``fail`` expectation failed on rows of a batch (nothing of the batch was written).
    EXPECTATION_FAILED = "expectation_failed"
    #: Records changed schema in a way ``silver.schema_changes`` says ``fail`` to.
    SCHEMA_CHANGE_REFUSED = "schema_change_refused"
    #: The spec's ``silver.transform`` raised.
    TRANSFORM_FAILED = "transform_failed"
    #: The flow's lease passed to another owner while it ran.
    LEASE_LOST = "lease_lost"
    #: Another owner held the flow's lease when it was to start.
    LEASE_HELD = "lease_held"
    #: A misconfiguration: the spec, or a flow's checkpoint and tables disagree.
    CONFIG_ERROR = "config_error"
    #: The source failed: its broker or topic (Kafka), its files.
    SOURCE_ERROR = "source_error"
    #: The source stayed unreachable for ``source.unavailable_for`` while the flow waited for it.
    SOURCE_UNAVAILABLE = "source_unavailable"
    #: A disk the flow writes to is full.
    DISK_FULL = "disk_full"
    #: Another flow of the same Spark application failed, and the runner stopped them all.
    OTHER_FLOW_FAILED = "other_flow_failed"
    #: Any other failure.
    CRASH = "crash"

    @property
    def repeats_on_restart(self) -> bool:
        """A refusal the spec asked for: the next start replays the same batch and stops again,
        so a restart is no cure (Dagster does not retry it)."""
        return self in (StopReason.EXPECTATION_FAILED, StopReason.SCHEMA_CHANGE_REFUSED)

    @property
    def final(self) -> bool:
        """No supervisor starts the flow again: a refusal that repeats on restart, or a source
        that stayed unreachable for as long as the spec allows (the flow already waited)."""
        return self.repeats_on_restart or self is StopReason.SOURCE_UNAVAILABLE


@dataclass(frozen=True)
class FlowStopped:
    """A flow stopped: why, the error as reported (a clean stop: who asked for it), the query
    whose failure stopped it, (``EXPECTATION_FAILED``) the ``fail`` expectations that failed,
    when (ISO 8601, UTC; empty in a record of an earlier version) and the runner's exit code
    (None until the runner knows it, and in earlier records)."""

    flow: str
    reason: StopReason
    message: str = ""
    query: str | None = None
    expectations: tuple[str, ...] = ()
    #: Not compared: two records of one stop are equal whenever they were made.
    at: str = field(default_factory=iso_utc, compare=False)
    exit_code: int | None = None

    TYPE = "flow_stopped"

    @property
    def first_line(self) -> str:
        """The message's first line (an error's, without its stack trace); empty if none."""
        text = self.message.strip()
        return text.splitlines()[0] if text else ""

    def to_json(self) -> JsonObject:
        return {
            "type": self.TYPE,
            "flow": self.flow,
            "reason": self.reason.value,
            "message": self.message,
            "query": self.query,
            "expectations": list(self.expectations),
            "at": self.at,
            "exit_code": self.exit_code,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> FlowStopped:
        read = _Fields(data, "a flow-stopped message")
        return cls(
            flow=read.required("flow", str),
            reason=read.required("reason", StopReason),
            message=read.get("message", str, ""),
            query=read.optional("query", str),
            expectations=tuple(str(name) for name in data.get("expectations") or ()),
            at=read.get("at", str, ""),
            exit_code=read.optional("exit_code", _strict_int),
        )


@dataclass(frozen=True)
class ErrorReported:
    """An error as the user reads it (also in the run's logs)."""

    message: str

    TYPE = "error"

    def to_json(self) -> JsonObject:
        return {"type": self.TYPE, "message": self.message}

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ErrorReported:
        return cls(_Fields(data, "an error message").required("message", str))


Message = BatchCommitted | StageStarted | FlowStopped | ErrorReported
_KINDS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    kind.TYPE: kind.parse for kind in (BatchCommitted, StageStarted, FlowStopped, ErrorReported)
}


def parse_message(data: Any) -> Message:
    """The message a JSON object of :meth:`to_json` holds.

    Raises:
        MessageError: not a message of a kind this version knows, or a field it cannot read.
    """
    if not isinstance(data, Mapping):
        raise MessageError(f"a message must be a JSON object, not {data!r}")
    kind = _KINDS.get(str(data.get("type")))
    if kind is None:
        known = ", ".join(sorted(_KINDS))
        raise MessageError(f"a message of unknown type {data.get('type')!r} (known: {known})")
    return kind(data)

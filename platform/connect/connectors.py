"""Debezium PostgreSQL connectors on the local Connect worker (``worker.py``): what each one is
(:class:`ConnectorSpec`), the REST calls that create, watch, list and delete it, and what to do
when one fails.

Standalone Connect keeps connectors created through REST in memory only; the manager records
each one's spec in ``connectors.json`` (no password: the worker reads it from a properties file
through Kafka's ``FileConfigProvider``), so a restarted worker (after a crash or a kill) gets its
connectors back, resuming from the file offset store, and a dead worker's slots can still be
found and dropped (``slots.py``: deleting a connector drops its slot, which would otherwise pin
PostgreSQL's WAL).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from local_service import locked, say  # platform/services/local_service.py
from server import DATABASE  # platform/postgres/server.py
from slots import SLOT_RELEASE_SECONDS, drop_slot, pg_access, slot_exists
from worker_files import WorkerPaths, read_registry, require_worker, write_registry, write_secrets

from pipelines.errors import ConfigError
from pipelines.settings import Settings

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
#: What a slot or publication name may hold (PostgreSQL: lower case, digits, "_", 63 bytes).
_NAME_RE = re.compile(r"[^a-z0-9_]")
#: Lines of a failed task's trace shown (then each of its "Caused by:" lines).
TRACE_LINES = 4
POLL_SECONDS = 0.5


class ConnectError(RuntimeError):
    """The worker refused a request or does not answer, or a connector failed."""


# --------------------------------------------------------------------------- specs


def pg_name(connector: str) -> str:
    """The default slot and publication name of ``connector``: ``conflux_<name>`` in the
    characters PostgreSQL allows, at most 63 of them."""
    return ("conflux_" + _NAME_RE.sub("_", connector.lower()))[:63]


@dataclass(frozen=True)
class ConnectorSpec:
    """One Debezium PostgreSQL connector as the manager records it (never its password)."""

    name: str
    database: str
    tables: tuple[str, ...]
    topic_prefix: str
    slot: str
    publication: str
    snapshot_mode: str = "initial"
    decimal_handling_mode: str = "precise"
    time_precision_mode: str = "adaptive"
    #: The JSON converters' ``schemas.enable`` for this connector; None: the worker's.
    schemas: bool | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "tables": list(self.tables)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ConnectorSpec:
        return cls(**{**record, "tables": tuple(record["tables"])})

    def config(self, port: int, user: str, password_ref: str) -> dict[str, str]:
        """The connector's Connect configuration against PostgreSQL on 127.0.0.1:``port``.

        ``publication.autocreate.mode=filtered``: Debezium creates the publication for the
        listed tables only (``all_tables`` would need every table's changes decoded and sent).
        Topics are created by Connect with one partition and one replica, as the local broker
        has one node (``topic.creation.default.*``)."""
        config = {
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "database.hostname": "127.0.0.1",
            "database.port": str(port),
            "database.user": user,
            "database.password": password_ref,
            "database.dbname": self.database,
            "topic.prefix": self.topic_prefix,
            "plugin.name": "pgoutput",
            "slot.name": self.slot,
            "publication.name": self.publication,
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(self.tables),
            "snapshot.mode": self.snapshot_mode,
            "decimal.handling.mode": self.decimal_handling_mode,
            "time.precision.mode": self.time_precision_mode,
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1",
        }
        if self.schemas is not None:
            for side in ("key", "value"):
                config[f"{side}.converter"] = JSON_CONVERTER
                config[f"{side}.converter.schemas.enable"] = str(self.schemas).lower()
        return {**config, **self.extra}


# --------------------------------------------------------------------------- REST


@dataclass(frozen=True)
class ConnectRest:
    """Connect's REST API at ``url`` (``http://127.0.0.1:<port>``)."""

    url: str
    timeout: float = 15.0

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer (None when empty); :class:`ConnectError` with Connect's own
        message on an HTTP error, naming the fix when the worker does not answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        request.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise ConnectError(f"{method} {path}: HTTP {exc.code}: {_rest_message(exc)}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectError(
                f"the Connect worker at {self.url} does not answer ({exc}): see "
                "`worker.py status`, start it with `make connect-start`"
            ) from exc
        return json.loads(text) if text.strip() else None

    def answers(self) -> bool:
        try:
            self.call("GET", "/connectors")
        except ConnectError:
            return False
        return True

    def status(self, name: str) -> dict[str, Any] | None:
        """The connector's status, None if the worker has no such connector."""
        try:
            result = self.call("GET", f"/connectors/{name}/status")
        except ConnectError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        return dict(result)


def _rest_message(error: urllib.error.HTTPError) -> str:
    try:
        body = error.read().decode()
    except OSError:
        return error.reason
    try:
        return str(json.loads(body).get("message", body))
    except (ValueError, AttributeError):
        return body.strip()[:500]


def validate(rest: ConnectRest, name: str, config: dict[str, str]) -> None:
    """Have the connector check ``config`` (values, and that it can log in to the database);
    :class:`ConfigError` naming each setting it refuses and why.

    Asked separately, before the connector is created: Connect 4.1.1 answers an invalid
    Debezium 3.6 configuration given to ``PUT /connectors/<name>/config`` with HTTP 500 (a
    NullPointerException on a setting Debezium declares without a value,
    ``internal.legacy.snapshot.max.threads``) instead of the errors."""
    answer = rest.call(
        "PUT", f"/connector-plugins/{CONNECTOR_CLASS}/config/validate", {**config, "name": name}
    )
    if not answer.get("error_count"):
        return
    errors = [
        f"{value['name']}: {'; '.join(value['errors'])}"
        for value in (entry.get("value") for entry in answer.get("configs", []))
        if value and value.get("errors")
    ]
    raise ConfigError(
        f"connector {name} is refused by Debezium:\n  " + "\n  ".join(errors) + "\nfix these "
        "options (worker.py create --help; --set KEY=VALUE for the others) and create it again"
    )


# --------------------------------------------------------------------------- running


def wait_running(rest: ConnectRest, name: str, timeout: float, log_file: Path) -> dict[str, Any]:
    """Block until the connector and every task are RUNNING; return its status.

    A FAILED connector or task raises :class:`ConnectError` at once with the first lines of
    its trace and the fix for the usual causes."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = rest.status(name)
        if status is not None:
            failed = _failure(status)
            if failed is not None:
                raise ConnectError(_failure_report(name, failed, log_file))
            tasks = status.get("tasks") or []
            states = {status["connector"]["state"], *(task["state"] for task in tasks)}
            if tasks and states == {"RUNNING"}:
                return status
        time.sleep(POLL_SECONDS)
    raise ConnectError(
        f"connector {name} is not RUNNING after {timeout:.0f} s (status: {json.dumps(status)}): "
        f"see {log_file}; pass a longer --timeout if it is only slow"
    )


def _failure(status: dict[str, Any]) -> dict[str, Any] | None:
    """The first FAILED part of a status (the connector itself, or a task)."""
    parts = [{"id": "connector", **status["connector"]}, *(status.get("tasks") or [])]
    return next((part for part in parts if part.get("state") == "FAILED"), None)


def _failure_report(name: str, failed: dict[str, Any], log_file: Path) -> str:
    trace = str(failed.get("trace") or "(no trace)")
    lines = trace.splitlines()
    causes = [line for line in lines[1:] if line.startswith("Caused by:")]
    head = "\n".join(f"    {line}" for line in [*lines[:TRACE_LINES], *causes])
    part = "the connector" if failed["id"] == "connector" else f"task {failed['id']}"
    return (
        f"connector {name} FAILED ({part}):\n{head}\nfix: {fix_for(trace)}\n(full log: "
        f"{log_file}; the failed connector stays: `worker.py delete {name}` removes it and its slot)"
    )


#: (what a trace says, what to do), the first match wins.
_FIXES = (
    (
        "wal_level",
        "PostgreSQL runs without logical decoding: restart it with the project's manager "
        "(make postgres-stop postgres-start), which sets wal_level=logical",
    ),
    (
        "all replication slots are in use",
        "PostgreSQL has no free replication slot: delete connectors you no longer need "
        "(worker.py delete NAME), or drop stale slots (SELECT pg_drop_replication_slot(...))",
    ),
    (
        "is active for PID",
        "another client reads this replication slot: pass another --slot, or delete the "
        "connector that owns it",
    ),
    (
        "password authentication failed",
        "the password in .runtime/postgres/credentials.json is not the server's: restart "
        "PostgreSQL with the project's manager (make postgres-start) and create the connector again",
    ),
    (
        "Connection refused",
        "PostgreSQL does not answer: start it (make postgres-start), then create the "
        "connector again",
    ),
    (
        "No table filters found",
        "no table of --tables exists in the database: create the tables first (or fix --tables), "
        "then delete and create the connector again",
    ),
    (
        "does not exist",
        "a database or table named in the connector is missing: create it in PostgreSQL, or "
        "fix --database / --tables, then delete and create the connector again",
    ),
)


def fix_for(trace: str) -> str:
    """What to do about a failed connector, from its trace."""
    for needle, fix in _FIXES:
        if needle in trace:
            return fix
    return (
        "read the trace above and the worker's log, fix the connector's settings, then "
        "`worker.py delete NAME` and create it again"
    )


def describe(rest: ConnectRest | None, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every connector the worker runs or the manager recorded: its state, its tasks' states
    (a failed task's first trace line) and the slot, publication and topics it owns."""
    live: dict[str, Any] = {}
    if rest is not None:
        live = rest.call("GET", "/connectors?expand=status") or {}
    listing = []
    for name in sorted({*live, *records}):
        status = (live.get(name) or {}).get("status") or {}
        record = records.get(name, {})
        tasks = [
            {
                "id": task["id"],
                "state": task["state"],
                **({"trace": task["trace"].splitlines()[0]} if task.get("trace") else {}),
            }
            for task in status.get("tasks") or []
        ]
        entry: dict[str, Any] = {
            "name": name,
            "state": (status.get("connector") or {}).get("state", "NOT RUNNING"),
            "tasks": tasks,
            "recorded": name in records,
        }
        if record:
            entry.update({key: record[key] for key in ("database", "slot", "publication")})
            entry["topics"] = f"{record['topic_prefix']}.<schema>.<table>"
        listing.append(entry)
    return listing


# --------------------------------------------------------------------------- create / delete


def create_connector(
    settings: Settings, spec: ConnectorSpec, timeout: float = 120.0
) -> dict[str, Any]:
    """Create ``spec`` on the running worker (it snapshots, then streams) and wait until its
    task is RUNNING. The same spec again is a no-op; another under the same name is refused."""
    paths = WorkerPaths.of(settings)
    state = require_worker(paths)
    pg = pg_access(settings)
    rest = ConnectRest(state["rest_url"])
    with locked(paths.lock):
        registry = read_registry(paths)
        recorded = registry.get(spec.name)
        if recorded is not None and recorded != spec.record():
            raise ConfigError(
                f"a connector {spec.name} exists with other settings: delete it first "
                f"(worker.py delete {spec.name}), or choose another name"
            )
        config = spec.config(pg.port, pg.user, write_secrets(paths, pg))
        validate(rest, spec.name, config)
        if recorded is None and slot_exists(pg, spec.database, spec.slot):
            raise ConfigError(
                f"replication slot {spec.slot} already exists in database {spec.database} (left "
                "by an earlier connector?): pass another --slot, or drop it with "
                f"SELECT pg_drop_replication_slot('{spec.slot}')"
            )
        if recorded is None or rest.status(spec.name) is None:
            rest.call("PUT", f"/connectors/{spec.name}/config", config)
        else:
            say(f"connector {spec.name} already exists with these settings")
        registry[spec.name] = spec.record()
        write_registry(paths, registry)
    status = wait_running(rest, spec.name, timeout, paths.log_file)
    say(
        f"connector {spec.name} RUNNING: {', '.join(spec.tables)} of database {spec.database} "
        f"to topics {spec.topic_prefix}.<schema>.<table> (slot {spec.slot}, publication "
        f"{spec.publication}; `worker.py delete {spec.name}` drops them)"
    )
    return {"name": spec.name, "status": status, "config": {**config}}


def delete_connector(settings: Settings, name: str) -> list[str]:
    """Delete connector ``name``: stop it, forget its offsets (so a connector created again under
    this name starts with a new snapshot, not from a position its new slot never had), delete
    it, then drop its slot and publication. Returns what was dropped in PostgreSQL."""
    paths = WorkerPaths.of(settings)
    state = require_worker(paths)
    rest = ConnectRest(state["rest_url"])
    with locked(paths.lock):
        registry = read_registry(paths)
        spec = _spec_of(rest, name, registry)
        if rest.status(name) is not None:
            _stop_and_forget(rest, name)
            rest.call("DELETE", f"/connectors/{name}")
        else:
            say(
                f"the worker runs no connector {name}; its offsets stay in {paths.offsets}: "
                "create it again under another name, or `worker.py stop` to clear them"
            )
        dropped = drop_slot(
            pg_access(settings), spec.database, spec.slot, spec.publication, SLOT_RELEASE_SECONDS
        )
        registry.pop(name, None)
        write_registry(paths, registry)
    what = " and ".join(dropped) or f"nothing (slot {spec.slot} was already gone)"
    say(f"deleted connector {name}; dropped {what} in database {spec.database}")
    return dropped


def _spec_of(rest: ConnectRest, name: str, registry: dict[str, dict[str, Any]]) -> ConnectorSpec:
    """The recorded spec, or one read from the worker's config (a connector made by hand)."""
    if name in registry:
        return ConnectorSpec.from_record(registry[name])
    if rest.status(name) is None:
        raise ConfigError(f"there is no connector {name}: see `worker.py list`")
    config = rest.call("GET", f"/connectors/{name}/config")
    return ConnectorSpec(
        name=name,
        database=config.get("database.dbname", DATABASE),
        tables=tuple(config.get("table.include.list", "").split(",")),
        topic_prefix=config.get("topic.prefix", name),
        slot=config.get("slot.name", "debezium"),
        publication=config.get("publication.name", "dbz_publication"),
    )


def _stop_and_forget(rest: ConnectRest, name: str, timeout: float = 30.0) -> None:
    """Stop the connector's tasks (the slot's reader ends) and reset its offsets (Connect
    accepts that only for a STOPPED connector)."""
    rest.call("PUT", f"/connectors/{name}/stop")
    deadline = time.monotonic() + timeout
    while (rest.status(name) or {}).get("connector", {}).get("state") != "STOPPED":
        if time.monotonic() >= deadline:
            raise ConnectError(f"connector {name} did not stop within {timeout:.0f} s")
        time.sleep(0.3)
    rest.call("DELETE", f"/connectors/{name}/offsets")

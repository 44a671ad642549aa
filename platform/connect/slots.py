"""The PostgreSQL side of a Debezium connector: the login the connectors use (the project's
PostgreSQL manager's role and password) and the replication slot and publication each one owns.

Why dropping them matters: a logical replication slot keeps every WAL segment from its confirmed
position on. A connector that is deleted, or a worker that is stopped, reads no more, so its
slot pins WAL until PostgreSQL's disk fills. ``worker.py delete`` and ``worker.py stop`` drop the
slot and the publication of every connector they end (:func:`drop_slot`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg2
from local_service import read_json  # platform/services/local_service.py
from server import ROLE, PostgresPaths, server_pid  # platform/postgres/server.py

from pipelines.errors import ConfigError
from pipelines.settings import Settings

#: Seconds a slot's reader has to end after its connector stopped, before it is terminated.
SLOT_RELEASE_SECONDS = 15.0


class SlotError(RuntimeError):
    """A replication slot could not be dropped."""


@dataclass(frozen=True)
class PgAccess:
    """How to log in to the project's PostgreSQL (its manager's role and password)."""

    port: int
    user: str
    password: str

    def connect(self, database: str) -> Any:
        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=self.user, password=self.password,
            dbname=database, connect_timeout=5,
        )  # fmt: skip
        conn.autocommit = True
        return conn


def pg_access(settings: Settings) -> PgAccess:
    """The project's PostgreSQL login; :class:`ConfigError` naming the fix when it is down."""
    pg_paths = PostgresPaths.of(settings)
    saved = read_json(pg_paths.credentials) or {}
    if server_pid(pg_paths) is None or not {"port", "password"} <= saved.keys():
        raise ConfigError(
            f"the project's PostgreSQL is not running ({pg_paths.data}): start it with "
            "`make postgres-start` (it runs with wal_level=logical for Debezium)"
        )
    return PgAccess(int(saved["port"]), ROLE, str(saved["password"]))


def slot_exists(pg: PgAccess, database: str, slot: str) -> bool:
    conn = pg.connect(database)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cursor.fetchone() is not None
    finally:
        conn.close()


def drop_slot(pg: PgAccess, database: str, slot: str, publication: str, wait: float) -> list[str]:
    """Drop ``slot`` and ``publication`` in ``database``; return what was dropped.

    A slot is dropped only once nobody reads it: the connector's walsender ends when its task
    stops, a moment after Connect says so; after ``wait`` seconds the reader is terminated.
    A logical slot must be dropped from a session on its own database."""
    conn = pg.connect(database)
    dropped = []
    try:
        with conn.cursor() as cursor:
            if _release_slot(cursor, slot, wait):
                cursor.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                dropped.append(f"replication slot {slot}")
            cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
            if cursor.fetchone() is not None:
                cursor.execute(f'DROP PUBLICATION "{publication}"')
                dropped.append(f"publication {publication}")
    finally:
        conn.close()
    return dropped


def _release_slot(cursor: Any, slot: str, wait: float) -> bool:
    """Wait until ``slot`` is inactive (terminating its reader after ``wait`` seconds); False
    if there is no such slot."""
    deadline, terminated = time.monotonic() + wait, False
    while True:
        cursor.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cursor.fetchone()
        if row is None:
            return False
        if row[0] is None:
            return True
        if time.monotonic() >= deadline:
            if terminated:
                raise SlotError(
                    f"replication slot {slot} is still read by PostgreSQL process {row[0]}, "
                    f"which did not end when terminated: drop the slot by hand "
                    f"(SELECT pg_drop_replication_slot('{slot}')) once it is inactive"
                )
            cursor.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            deadline, terminated = time.monotonic() + wait, True
        time.sleep(0.2)

"""The CDC demo (``make demo-cdc``): a real PostgreSQL table's changes, captured by Debezium, land
in Conflux's silver tables, and the current-state table equals ``SELECT *`` of the table.

1. The demo database ``shop`` gets a fresh ``customers`` table with five rows (they reach Kafka
   as the connector's snapshot, ``op: r``).
2. The Debezium connector ``shop`` is created on the project's Connect worker (its replication
   slot and publication with it); a connector left by an earlier run is deleted first, its slot
   dropped.
3. Two sessions change the table in multi-statement transactions: inserts, updates, a delete.
4. ``conflux run shop_customers --once`` (the flow in this folder; its tables under
   ``<runtime>/demo-cdc``) parses the changes into events, the current state and the history.
5. The Connect worker crashes (kill -9) right after more changes, before it records how far it
   read: started again, it sends them again. Those updates leave customer 1's 20 KB ``notes``
   (stored out of line: TOAST) alone, so Debezium sends a placeholder instead of its value.
6. ``conflux run`` again: each change lands in the events table once, the notes are carried
   forward, and the current-state table, read with delta-rs, equals ``SELECT * FROM customers``.

The connector runs with Debezium's defaults: ``numeric(12,2)`` arrives as base64 bytes of the
unscaled value with the scale in the record's schema, ``timestamptz`` as an ISO 8601 string;
Conflux decodes both into the declared ``DECIMAL(12,2)`` and ``TIMESTAMP``
(``pipelines/silver/debezium.py``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [
    str(ROOT),
    *(str(ROOT / "platform" / d) for d in ("services", "postgres", "connect")),
]

import pyarrow as pa  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from deltalake import DeltaTable, QueryBuilder  # noqa: E402
from slots import pg_access  # noqa: E402  (platform/connect/slots.py: the project's login)

from pipelines.settings import Settings, load_settings  # noqa: E402

HERE = Path(__file__).resolve().parent
DATABASE, CONNECTOR, TOPIC = "shop", "shop", "shop.public.customers"
WORKER = [sys.executable, str(ROOT / "platform" / "connect" / "worker.py")]
CONFLUX = str(Path(sys.executable).parent / "conflux")
COLUMNS = ("id", "name", "email", "tier", "balance", "updated_at", "notes")
TABLE = """CREATE TABLE public.customers (
    id integer PRIMARY KEY, name text NOT NULL, email text, tier text NOT NULL,
    balance numeric(12, 2) NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), notes text)"""
#: Customer 1's notes: 20 KB that do not compress, so PostgreSQL stores them out of line (TOAST).
NOTES = "".join(f"{n:08x}" for n in random.Random(1).choices(range(2**32), k=2560))
SEED = [
    (1, "Ada Lovelace", "ada@example.com", "gold", "120.50"),
    (2, "Alan Turing", "alan@example.com", "free", "0.00"),
    (3, "Grace Hopper", "grace@example.com", "silver", "75.25"),
    (4, "Edsger Dijkstra", None, "free", "10.00"),
    (5, "Barbara Liskov", "barbara@example.com", "platinum", "999.99"),
]


def say(line: str) -> None:
    print(f"  {line}", flush=True)


def connect(settings: Settings, database: str) -> Any:
    """A session on the project's PostgreSQL with transactions of its own (the workload's)."""
    conn = pg_access(settings).connect(database)
    conn.autocommit = False
    return conn


def fresh_table(settings: Settings) -> None:
    """The ``shop`` database with a new ``customers`` table and its five first rows."""
    admin = connect(settings, "postgres")
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE DATABASE {DATABASE}")
    admin.close()
    with connect(settings, DATABASE) as conn, conn.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS public.customers")
        cursor.execute(TABLE)
        cursor.executemany(
            "INSERT INTO public.customers (id, name, email, tier, balance) VALUES (%s,%s,%s,%s,%s)",
            SEED,
        )
        cursor.execute("UPDATE public.customers SET notes = %s WHERE id = 1", (NOTES,))
    say(f"PostgreSQL: database {DATABASE}, table public.customers with {len(SEED)} rows")


def fresh_flow(settings: Settings) -> dict[str, str]:
    """The demo flow's own lake and checkpoints (emptied), and its topic deleted: each run of the
    demo starts from nothing. Returns the environment ``conflux`` runs with."""
    root = settings.runtime_dir / "demo-cdc"
    shutil.rmtree(root, ignore_errors=True)
    admin = AdminClient({"bootstrap.servers": settings.resolved_bootstrap_servers()})
    if TOPIC in admin.list_topics(timeout=30).topics:
        for future in admin.delete_topics([TOPIC]).values():
            future.result()
        time.sleep(2)  # the deletion completes in the background
    return {
        **os.environ,
        "CONFLUX_FLOWS_DIR": str(HERE),
        "CONFLUX_LAKE_ROOT": str(root / "lake"),
        "CONFLUX_CHECKPOINTS_ROOT": str(root / "checkpoints"),
    }


def create_connector() -> None:
    listed = subprocess.run([*WORKER, "list"], capture_output=True, text=True, check=True)
    if f'"{CONNECTOR}"' in listed.stdout:
        subprocess.run([*WORKER, "delete", CONNECTOR], capture_output=True, check=True)
        say(f"deleted the connector {CONNECTOR} of an earlier run (and dropped its slot)")
    subprocess.run(
        [*WORKER, "create", CONNECTOR, "--database", DATABASE, "--tables", "public.customers"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    say(f"Debezium connector {CONNECTOR} running: slot conflux_{CONNECTOR}, topic {TOPIC}")


def workload(settings: Settings) -> None:
    """Two sessions, interleaved multi-statement transactions: the WAL orders them by commit."""
    first, second = connect(settings, DATABASE), connect(settings, DATABASE)
    with first.cursor() as a, second.cursor() as b:
        a.execute(
            "UPDATE customers SET tier = 'gold', balance = balance + 30, updated_at = now() WHERE id = 2"
        )
        b.execute(
            "INSERT INTO customers (id, name, email, tier, balance) VALUES (6, 'Ken Thompson', 'ken@example.com', 'free', 5.00)"
        )
        a.execute(
            "INSERT INTO customers (id, name, email, tier, balance) VALUES (7, 'Radia Perlman', NULL, 'silver', 42.42)"
        )
        b.execute(
            "UPDATE customers SET email = 'edsger@example.org', updated_at = now() WHERE id = 4"
        )
        second.commit()
        a.execute("DELETE FROM customers WHERE id = 3")
        a.execute("UPDATE customers SET balance = balance - 20.50, updated_at = now() WHERE id = 1")
        first.commit()
        b.execute("UPDATE customers SET tier = 'platinum', updated_at = now() WHERE id = 6")
        b.execute("UPDATE customers SET balance = 7.77, updated_at = now() WHERE id = 6")
        second.commit()
    first.close(), second.close()
    say("two sessions: 3 transactions, 2 inserts, 6 updates and a delete")


def crash_after_changes(settings: Settings) -> int:
    """Two transactions update customer 1 (never its notes) and 2; once they are in Kafka, and
    before the worker recorded how far it read (it does every ``offset.flush.interval.ms``, 5 s,
    when there is something new), it is killed -9 (had it recorded them already, another round).
    Started again, it resumes from the recorded offsets and sends the changes again. Returns
    the records it sent again."""
    offsets = settings.runtime_dir / "connect" / "offsets.dat"
    updates = 0
    for _ in range(5):
        recorded, before = offsets.stat().st_mtime_ns, topic_records(settings)
        with connect(settings, DATABASE) as conn, conn.cursor() as cursor:
            cursor.execute(
                "UPDATE customers SET balance = balance + 1, updated_at = now() WHERE id = 1"
            )
            cursor.execute(
                "UPDATE customers SET tier = 'platinum', updated_at = now() WHERE id = 1"
            )
        with connect(settings, DATABASE) as conn, conn.cursor() as cursor:
            cursor.execute(
                "UPDATE customers SET balance = balance + 2, updated_at = now() WHERE id = 2"
            )
        updates += 3
        deadline = time.monotonic() + 4
        while topic_records(settings) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        if offsets.stat().st_mtime_ns == recorded:
            break
    sent = topic_records(settings)
    pid = json.loads((offsets.parent / "worker.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    say(
        f"{updates} more updates (customer 1's notes untouched); the worker is killed -9 (pid {pid})"
    )
    subprocess.run([*WORKER, "start"], capture_output=True, text=True, check=True)
    deadline = time.monotonic() + 30
    while topic_records(settings) <= sent and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the rest of what it sends again
    resent = topic_records(settings) - sent
    say(f"started again, it resumes from its last recorded offsets: {resent} records sent again")
    return resent


def topic_records(settings: Settings) -> int:
    """How many records the demo topic holds (one partition)."""
    consumer = Consumer({"bootstrap.servers": settings.resolved_bootstrap_servers(),
                         "group.id": "conflux-demo-cdc"})  # fmt: skip
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        return int(high - low)
    finally:
        consumer.close()


def run_flow(settings: Settings, env: dict[str, str], log: str) -> bool:
    """``conflux run shop_customers --once``; its output in ``<runtime>/demo-logs/<log>``."""
    run = subprocess.run(
        [CONFLUX, "run", "shop_customers", "--once"], env=env, capture_output=True, text=True
    )
    logs = settings.runtime_dir / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / log).write_text(run.stdout + run.stderr)
    if run.returncode != 0:
        print(run.stderr[-3000:], file=sys.stderr)
        return False
    say(f"conflux run shop_customers --once: exit 0 (log: {logs / log})")
    return True


def changes_stored(env: dict[str, str]) -> tuple[int, int]:
    """The events table's rows, and how many distinct changes (key, LSN, op) they are."""
    table = DeltaTable(
        str(Path(env["CONFLUX_LAKE_ROOT"]) / "silver" / "silver_shop_customer_events")
    )
    rows = table.to_pyarrow_table(columns=["id", "_source_lsn", "_op"]).to_pylist()
    return len(rows), len({(r["id"], r["_source_lsn"], r["_op"]) for r in rows})


def postgres_rows(settings: Settings) -> list[tuple[Any, ...]]:
    with connect(settings, DATABASE) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(COLUMNS)} FROM customers ORDER BY id")
        return [tuple(row) for row in cursor.fetchall()]


def current_rows(env: dict[str, str]) -> list[tuple[Any, ...]]:
    table = DeltaTable(str(Path(env["CONFLUX_LAKE_ROOT"]) / "silver" / "shop_customers"))
    query = f"SELECT {', '.join(COLUMNS)} FROM t"  # QueryBuilder reads deletion vectors
    rows = pa.table(QueryBuilder().register("t", table).execute(query).read_all()).to_pylist()
    return sorted(tuple(row[c] for c in COLUMNS) for row in rows)


def comparable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with its timestamp as a UTC instant and its decimal exact, whichever side read it."""
    *rest, updated_at, notes = row
    instant = updated_at.timestamp() if updated_at.tzinfo else updated_at.replace(tzinfo=None)
    exact = (Decimal(str(v)) if isinstance(v, Decimal | float) else v for v in rest)
    return (*exact, instant, notes)


def main() -> int:
    settings = load_settings()
    print("\n== change data capture: Debezium reads PostgreSQL, Conflux lands it in silver")
    fresh_table(settings)
    env = fresh_flow(settings)
    create_connector()
    workload(settings)
    time.sleep(8)  # Debezium publishes within a second or two; no wait in Conflux depends on it
    if not run_flow(settings, env, "cdc.log"):
        return 1
    print("\n== the Connect worker crashes: Debezium delivers at least once")
    resent = crash_after_changes(settings)
    if not run_flow(settings, env, "cdc-after-crash.log"):
        return 1
    rows, distinct = changes_stored(env)
    say(f"the topic holds {topic_records(settings)} records ({resent} sent twice, and tombstones); "
        f"the events table {rows} changes, {distinct} distinct: each once")  # fmt: skip
    expected, landed = postgres_rows(settings), current_rows(env)
    print(f"\n  SELECT * FROM customers ({len(expected)} rows) and silver shop_customers:")
    for row in landed:
        *shown, notes = row
        print(
            "   ",
            json.dumps(
                [*shown, f"notes: {len(notes)} chars" if notes else "no notes"], default=str
            ),
        )
    same = [comparable(r) for r in expected] == [comparable(r) for r in landed]
    verdict = "equal, value for value" if same else "DIFFERENT"
    say(f"the current-state table and the PostgreSQL table are {verdict} (customer 1's notes too)")
    return 0 if same and rows == distinct else 1


if __name__ == "__main__":
    sys.exit(main())

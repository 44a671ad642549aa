"""A PostgreSQL workload for change-data-capture tests, and PostgreSQL's own record of it.

The workload (:class:`Workload`) changes one table, ``items``, with the column types a CDC path
must carry (``numeric(12,2)``, ``numeric`` without precision, ``timestamptz``, ``date``,
``jsonb``, ``uuid``, ``integer[]``) and a ``text`` column whose large values are TOASTed (stored
out of line, so an UPDATE of other columns does not log them). It is a list of rounds
(:class:`Round`): two sessions, each in a multi-statement transaction, their statements
interleaved and their commits in either order (each session owns the keys of one parity, so
the two never wait for each other's row locks); or one session alone for DDL
(``ALTER TABLE ... ADD COLUMN``) and a ``TRUNCATE``. Inserts, updates of some columns, updates
that change nothing, updates of the TOASTed column, several updates of one row in one
transaction, deletes and re-inserts of deleted keys, all drawn from a seeded generator.

The truth is PostgreSQL's, not the connector's: an AFTER INSERT/UPDATE/DELETE FOR EACH ROW
trigger writes every committed row version (the whole row, TOASTed values included) to
``items_audit`` with an increasing id and its transaction's id, and an AFTER TRUNCATE FOR EACH STATEMENT trigger writes
the truncate (:data:`AUDIT_DDL`). :func:`audit_entries` reads it back as typed rows (through
``jsonb_populate_record``, so each value has the type ``SELECT *`` gives it), and
:func:`expected_history` turns it into the SCD type 2 versions a history table must hold.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

#: The table's columns before the workload adds :data:`ADDED_COLUMN`.
COLUMNS = ("id", "price", "ratio", "seen_at", "due", "attrs", "ref", "tags", "body")
#: The column ``ALTER TABLE ... ADD COLUMN`` adds mid-stream.
ADDED_COLUMN = "note"
#: The Spark schema of :data:`COLUMNS` (``numeric`` without precision: 8 decimals at most here).
SILVER_SCHEMA = (
    "id INT, price DECIMAL(12,2), ratio DECIMAL(30,8), seen_at TIMESTAMP, due DATE, "
    "attrs STRING, ref STRING, tags ARRAY<INT>, body STRING"
)
#: Characters of a TOASTed value: random hex, which PostgreSQL cannot compress below its
#: in-line limit (~2 KB), so it is stored out of line.
TOAST_CHARS = 20_000
#: Debezium's stand-in for a TOASTed value an UPDATE left unchanged.
PLACEHOLDER = "__debezium_unavailable_value"

TABLE_DDL = """
CREATE TABLE public.{table} (
    id integer PRIMARY KEY,
    price numeric(12, 2) NOT NULL,
    ratio numeric,
    seen_at timestamptz,
    due date,
    attrs jsonb,
    ref uuid,
    tags integer[],
    body text
)"""

AUDIT_DDL = """
CREATE TABLE public.{table}_audit (
    audit_id bigserial PRIMARY KEY,
    txid bigint NOT NULL DEFAULT txid_current(),
    op text NOT NULL,
    row_image jsonb
);
CREATE FUNCTION public.{table}_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.{table}_audit (op, row_image) VALUES (
        TG_OP,
        CASE TG_OP WHEN 'DELETE' THEN to_jsonb(OLD) WHEN 'TRUNCATE' THEN NULL ELSE to_jsonb(NEW) END
    );
    RETURN NULL;
END $$;
CREATE TRIGGER {table}_audit_row AFTER INSERT OR UPDATE OR DELETE ON public.{table}
    FOR EACH ROW EXECUTE FUNCTION public.{table}_audit();
CREATE TRIGGER {table}_audit_truncate AFTER TRUNCATE ON public.{table}
    FOR EACH STATEMENT EXECUTE FUNCTION public.{table}_audit();
"""

Statement = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class Round:
    """Statements of up to two sessions (``a``, ``b``) in execution order, each session's in one
    transaction, committed in ``commits`` order."""

    steps: tuple[tuple[str, Statement], ...]
    commits: tuple[str, ...]

    def statements(self) -> int:
        return len(self.steps)


@dataclass
class _Keys:
    """What one session knows of its keys: live (and whether TOASTed), deleted."""

    parity: int
    live: dict[int, bool] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)


class Workload:
    """Seeded rounds of changes to ``public.<table>`` (see the module doc)."""

    def __init__(self, table: str, seed: int) -> None:
        self.table = table
        self.rng = random.Random(seed)
        self.sessions = {"a": _Keys(0), "b": _Keys(1)}
        self.next_id = 1
        self.has_note = False
        #: The TOASTed and the plain key :meth:`alter_round` inserts.
        self.noted: list[int] = []

    # --- values

    def toast(self) -> str:
        return self.rng.randbytes(TOAST_CHARS // 2).hex()

    def values(self, toasted: bool) -> dict[str, Any]:
        """A row's columns but ``id``, drawn at random (some null)."""
        rng = self.rng
        tz = timezone(timedelta(minutes=30 * rng.randint(-24, 24)))
        stamp = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.getrandbits(48))
        row = {
            "price": Decimal(rng.randint(-10**9, 10**9)).scaleb(-2),
            "ratio": Decimal(rng.randint(-10**13, 10**13)).scaleb(-rng.randint(0, 8)),
            "seen_at": stamp.astimezone(tz),
            "due": date(1960, 1, 1) + timedelta(days=rng.randint(0, 36_500)),
            "attrs": json.dumps({"k": rng.randint(0, 99), "s": f"v{rng.randint(0, 9)}",
                                 "l": [rng.randint(-5, 5) for _ in range(rng.randint(0, 3))]}),
            "ref": str(uuid.UUID(int=rng.getrandbits(128))),
            "tags": [rng.choice([rng.randint(-1000, 1000), None]) if rng.random() < 0.2
                     else rng.randint(-1000, 1000) for _ in range(rng.randint(0, 4))],
            "body": self.toast() if toasted else f"small {rng.randint(0, 10**6)}",
        }  # fmt: skip
        for column in ("ratio", "seen_at", "due", "attrs", "ref", "tags"):
            if rng.random() < 0.1:
                row[column] = None
        if self.has_note:
            row[ADDED_COLUMN] = rng.choice([None, f"note {rng.randint(0, 999)}"])
        return row

    # --- statements

    def _insert(self, key: int, row: dict[str, Any]) -> Statement:
        columns = ["id", *row]
        marks = ", ".join(_mark(c) for c in columns)
        sql = f"INSERT INTO public.{self.table} ({', '.join(columns)}) VALUES ({marks})"
        return sql, (key, *row.values())

    def _update(self, key: int, row: dict[str, Any]) -> Statement:
        sets = ", ".join(f"{c} = {_mark(c)}" for c in row)
        return f"UPDATE public.{self.table} SET {sets} WHERE id = %s", (*row.values(), key)

    def bulk_rows(self, count: int, toasted: int = 3) -> list[tuple[Any, ...]]:
        """``count`` rows for the initial snapshot, the first ``toasted`` with a TOASTed body;
        their keys are split between the two sessions by parity."""
        rows = []
        for _ in range(count):
            key = self._new_key(self.sessions["a" if self.next_id % 2 == 0 else "b"])
            big = key <= toasted
            self._session_of(key).live[key] = big
            rows.append((key, *self.values(big).values()))
        return rows

    def bulk_insert_sql(self) -> str:
        return f"INSERT INTO public.{self.table} ({', '.join(COLUMNS)}) VALUES %s"

    def bulk_template(self) -> str:
        return "(" + ", ".join(_mark(c) for c in COLUMNS) + ")"

    def _new_key(self, keys: _Keys) -> int:
        while self.next_id % 2 != keys.parity:
            self.next_id += 1
        key, self.next_id = self.next_id, self.next_id + 1
        return key

    def _session_of(self, key: int) -> _Keys:
        return self.sessions["a" if key % 2 == 0 else "b"]

    def statement(self, keys: _Keys, previous: int | None) -> tuple[Statement, int]:
        """One random statement of the session owning ``keys`` (and the key it changes);
        ``previous``: the key its last statement changed, changed again more often."""
        rng = self.rng
        roll = rng.random()
        live = sorted(keys.live)
        if not live or roll < (0.14 if len(live) > 30 else 0.4):  # a new key, some TOASTed
            key = self._new_key(keys)
            big = rng.random() < 0.15
            keys.live[key] = big
            return self._insert(key, self.values(big)), key
        if keys.deleted and roll < 0.2:  # a deleted key again
            key = rng.choice(sorted(keys.deleted))
            keys.deleted.discard(key)
            big = rng.random() < 0.15
            keys.live[key] = big
            return self._insert(key, self.values(big)), key
        if previous in keys.live and rng.random() < 0.3:
            key = previous
        else:
            toasted = [k for k in live if keys.live[k]]
            key = rng.choice(toasted if toasted and rng.random() < 0.3 else live)
        if roll < 0.3:  # delete
            del keys.live[key]
            keys.deleted.add(key)
            return (f"DELETE FROM public.{self.table} WHERE id = %s", (key,)), key
        if roll < 0.36:  # an update that changes no value
            return (f"UPDATE public.{self.table} SET price = price WHERE id = %s", (key,)), key
        if roll < 0.42:  # a new body, TOASTed or not
            big = rng.random() < 0.5
            keys.live[key] = big
            return self._update(key, {"body": self.toast() if big else "small again"}), key
        if self.has_note and roll < 0.55:  # the added column alone: untracked in history
            return self._update(key, {ADDED_COLUMN: f"note {rng.randint(0, 999)}"}), key
        fresh = self.values(False)
        fresh.pop("body")
        picked = rng.sample(sorted(fresh), rng.randint(1, 3))
        return self._update(key, {c: fresh[c] for c in picked}), key

    def transaction(self, name: str, statements: int) -> list[tuple[str, Statement]]:
        keys, previous, steps = self.sessions[name], None, []
        for _ in range(statements):
            stmt, previous = self.statement(keys, previous)
            steps.append((name, stmt))
        return steps

    def random_round(self) -> Round:
        """Both sessions in a transaction of 1-5 statements each, interleaved at random,
        committed in a random order."""
        rng = self.rng
        a = self.transaction("a", rng.randint(1, 5))
        b = self.transaction("b", rng.randint(1, 5))
        steps: list[tuple[str, Statement]] = []
        while a or b:
            side = a if (a and (not b or rng.random() < 0.5)) else b
            steps.append(side.pop(0))
        return Round(tuple(steps), tuple(rng.sample(["a", "b"], 2)))

    def rounds(self, statements: int) -> Iterator[Round]:
        """Random rounds of ``statements`` statements in all (about)."""
        done = 0
        while done < statements:
            round_ = self.random_round()
            done += round_.statements()
            yield round_

    # --- scripted rounds

    def toast_round(self) -> Round:
        """The TOASTed snapshot rows changed every way: twice in one transaction (other columns:
        two placeholders), a new TOASTed value, a delete."""
        toasted = sorted(k for s in self.sessions.values() for k, big in s.live.items() if big)
        first, second, third = toasted[:3]
        steps = [
            (_owner(first), self._update(first, {"price": Decimal("1.25")})),
            (_owner(second), self._update(second, {"body": self.toast()})),
            (_owner(first), self._update(first, {"ratio": Decimal("-0.00000001"), "tags": []})),
            (_owner(third), (f"DELETE FROM public.{self.table} WHERE id = %s", (third,))),
        ]
        self._session_of(third).live.pop(third)
        self._session_of(third).deleted.add(third)
        return Round(tuple(steps), ("b", "a"))

    def alter_round(self) -> Round:
        """``ALTER TABLE ADD COLUMN``, then two rows using it (one TOASTed), in one transaction."""
        self.has_note = True
        keys = self.sessions["a"]
        steps: list[tuple[str, Statement]] = [
            ("a", (f"ALTER TABLE public.{self.table} ADD COLUMN {ADDED_COLUMN} text", ()))
        ]
        self.noted = []
        for big in (True, False):
            key = self._new_key(keys)
            keys.live[key] = big
            self.noted.append(key)
            steps.append(("a", self._insert(key, self.values(big))))
        return Round(tuple(steps), ("a",))

    def note_round(self) -> Round:
        """The added column alone on the TOASTed row :meth:`alter_round` inserted (a placeholder
        and an untracked change), then with a tracked column on its plain row."""
        toasted, plain = self.noted
        steps = (
            ("a", self._update(toasted, {ADDED_COLUMN: "only the note"})),
            ("a", self._update(plain, {ADDED_COLUMN: "and the price", "price": Decimal(7)})),
        )
        return Round(steps, ("a",))

    def truncate_round(self) -> Round:
        """TRUNCATE, then in the same transaction re-inserts of key 1 (TOASTed, a new value) and
        key 2 (plain); every other key is gone until re-inserted."""
        for keys in self.sessions.values():
            keys.deleted |= set(keys.live)
            keys.live.clear()
        steps: list[tuple[str, Statement]] = [("a", (f"TRUNCATE public.{self.table}", ()))]
        for key, big in ((1, True), (2, False)):
            keys = self._session_of(key)
            keys.deleted.discard(key)
            keys.live[key] = big
            steps.append(("a", self._insert(key, self.values(big))))
        return Round(tuple(steps), ("a",))

    def after_truncate_round(self) -> Round:
        """Key 1, re-inserted by :meth:`truncate_round`, updated on another column: its
        placeholder stands for the value inserted after the TRUNCATE, not the one before."""
        return Round((("b", self._update(1, {"price": Decimal("99.99")})),), ("b",))


def _owner(key: int) -> str:
    return "a" if key % 2 == 0 else "b"


def _mark(column: str) -> str:
    return {"attrs": "%s::jsonb", "ref": "%s::uuid", "tags": "%s::integer[]"}.get(column, "%s")


def run_round(connections: dict[str, Any], round_: Round) -> int:
    """Execute ``round_`` on the two sessions' connections; the transaction id of the
    transaction committed last."""
    cursors = {name: connections[name].cursor() for name in {s for s, _ in round_.steps}}
    for name, (sql, params) in round_.steps:
        cursors[name].execute(sql, params)
    txid = 0
    for name in round_.commits:
        cursors[name].execute("SELECT txid_current()")
        txid = int(cursors[name].fetchone()[0])
        connections[name].commit()
    for cursor in cursors.values():
        cursor.close()
    return txid


# --- the truth --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit table: its transaction, ``op`` INSERT, UPDATE, DELETE or TRUNCATE,
    and the row (the new version, a deleted row's last one; None for a TRUNCATE) as ``SELECT *``
    types it."""

    audit_id: int
    txid: int
    op: str
    row: dict[str, Any] | None


def audit_entries(cursor: Any, table: str) -> list[AuditEntry]:
    """The audit table in order, each row typed by ``jsonb_populate_record`` of the table's row
    type (a column absent from an older row image, as the one added later, is null)."""
    cursor.execute(
        f"SELECT a.audit_id, a.txid, a.op, a.row_image IS NULL AS no_row, r.* "
        f"FROM public.{table}_audit a "
        f"LEFT JOIN LATERAL jsonb_populate_record(NULL::public.{table}, a.row_image) r ON true "
        f"ORDER BY a.audit_id"
    )
    names = [d.name for d in cursor.description]
    entries = []
    for record in cursor.fetchall():
        values = dict(zip(names, record, strict=True))
        row = {c: values[c] for c in names[4:]}
        entries.append(
            AuditEntry(
                values["audit_id"], values["txid"], values["op"], None if values["no_row"] else row
            )
        )
    return entries


def table_rows(cursor: Any, table: str) -> list[dict[str, Any]]:
    """``SELECT *`` of the table, by key."""
    cursor.execute(f"SELECT * FROM public.{table} ORDER BY id")
    names = [d.name for d in cursor.description]
    return [dict(zip(names, record, strict=True)) for record in cursor.fetchall()]


@dataclass
class Version:
    """One expected history version: its values, and how it ended (None: it is open)."""

    values: dict[str, Any]
    closed_by: str | None = None  # "update", "delete", "truncate"


def expected_history(
    entries: Iterable[AuditEntry], tracked: Sequence[str]
) -> dict[int, list[Version]]:
    """Per key, its versions in order: a row version opens one when a ``tracked`` column differs
    from the open version's (so consecutive versions equal in the tracked columns are one, its
    other columns those of the latest); a DELETE closes the key's open version, a TRUNCATE every
    open version."""
    history: dict[int, list[Version]] = {}
    open_: dict[int, Version] = {}
    for entry in entries:
        if entry.op == "TRUNCATE":
            for version in open_.values():
                version.closed_by = "truncate"
            open_.clear()
            continue
        assert entry.row is not None
        key = entry.row["id"]
        current = open_.get(key)
        if entry.op == "DELETE":
            assert current is not None, f"a delete of {key} with no open version"
            current.closed_by = "delete"
            del open_[key]
        elif current is not None and all(current.values[c] == entry.row[c] for c in tracked):
            current.values = dict(entry.row)  # an untracked change: the open version in place
        else:
            if current is not None:
                current.closed_by = "update"
            open_[key] = Version(dict(entry.row))
            history.setdefault(key, []).append(open_[key])
    return history


def typed(row: dict[str, Any], columns: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """``row``'s ``columns`` as (type name, value) pairs, in one form for PostgreSQL's rows and
    the Delta tables' alike: a ``timestamptz`` in UTC, a JSON document parsed."""
    out = []
    for column in columns:
        value = row.get(column)
        if isinstance(value, datetime):
            value = value.astimezone(UTC)
        elif column == "attrs" and isinstance(value, str):
            value = json.loads(value)
        out.append((type(value).__name__, value))
    return tuple(out)

"""The persistent task registry and harvest ledger: one SQLite file in the state directory.

A task argument that holds a password is stored masked; its value lives in an owner-only file beside the
database (freeride.agent.state.vault), written in the row's transaction and removed with the row.

Used from one thread only (the agent's database thread), so no locking here. WAL mode: a
kill -9 loses at most the transaction in flight, never a committed one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from dataclasses import asdict, replace
from pathlib import Path

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.state.vault import SecretFileError, SecretFiles, split
from freeride.core.private import create_private
from freeride.errors import FreerideError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    restarts INTEGER NOT NULL DEFAULT 0,
    created_unix_s REAL NOT NULL,
    updated_unix_s REAL NOT NULL,
    counters TEXT NOT NULL,
    progress TEXT NOT NULL DEFAULT '{}',
    checkpoint_steps INTEGER NOT NULL DEFAULT 0,
    step_estimate_ns INTEGER NOT NULL DEFAULT 0,
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ledger (gpu INTEGER PRIMARY KEY, counters TEXT NOT NULL);
"""


class RegistryError(FreerideError):
    """The state database cannot be opened or written."""


class RegistryWriteError(RegistryError):
    """A write failed (disk full, I/O error): nothing of it was committed; the caller still holds the data."""


class _RowError(Exception):
    """A row that does not decode: the file is corrupt where SQLite cannot see it."""


class Registry:
    def __init__(self, path: Path, secrets: SecretFiles | None = None) -> None:
        """`secrets`: where secret task arguments are kept (default: `secrets/` beside the database)."""
        self.path = path
        self._secrets = secrets if secrets is not None else SecretFiles(path.parent / "secrets")
        self._parked: set[str] = set()  # tasks FAILED at load for an unreadable secrets file (logged once)
        try:
            os.close(create_private(path, os.O_RDWR | os.O_CREAT))  # SQLite gives -wal and -shm the file's mode
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise RegistryError(
                    f"{path} has schema {row[0]}, this agent needs {SCHEMA_VERSION}: "
                    "use a matching freeride version or a new --state-dir"
                )
            check = self._db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check[0] if check else 'no answer'}")
            self._move_secrets_out()
            self._verify()
        except (sqlite3.Error, _RowError) as exc:
            self._db.close()
            raise RegistryError(
                f"state database {path} is unreadable ({exc}); move it aside to start fresh "
                "(tasks and the harvest ledger in it would be lost)"
            ) from exc

    def _move_secrets_out(self) -> None:
        """Rows an older freeride wrote with a password in clear: the value to its secrets file, the row masked."""
        rows = self._db.execute("SELECT id, spec FROM tasks").fetchall()
        try:
            found = [(str(i), spec, split(spec.get("args", {}))) for i, spec in ((i, json.loads(t)) for i, t in rows)]
        except (ValueError, TypeError, AttributeError) as exc:
            raise _RowError(f"a task row is corrupt: {exc}") from exc
        found = [f for f in found if f[2][1]]
        if not found:
            return
        with self._tx():
            for task_id, spec, (public, secret) in found:
                self._secrets.write(task_id, {**self._readable_secrets(task_id), **secret})
                self._db.execute("UPDATE tasks SET spec=? WHERE id=?", (json.dumps({**spec, "args": public}),
                                                                        int(task_id)))

    def _readable_secrets(self, task_id: str) -> dict[str, str]:
        """(Moving an older row's passwords out.) What the task's secrets file holds; nothing if it cannot be read:
        that row still holds every argument whole, so the file is rewritten from it."""
        try:
            return self._secrets.read(task_id) or {}
        except SecretFileError:
            return {}

    def _verify(self) -> None:
        """Decode every row now: SQLite has no checksums, so a flipped byte in a row shows only here."""
        self.load()
        for gpu in self.ledger_gpus():
            self.load_ledger(gpu)

    def close(self) -> None:
        self._db.close()

    def insert(self, rec: TaskRecord) -> str:
        try:
            with self._tx():  # the row and its secrets file, or neither
                return self._insert(rec)
        except (sqlite3.Error, OSError) as exc:
            raise RegistryWriteError(f"writing {self.path} failed: {exc}") from exc

    def _insert(self, rec: TaskRecord) -> str:
        public, secret = split(rec.spec.args)
        # The id follows the highest ever given, removed ones included (`last_id`): SQLite alone would give a
        # removed highest id out again, and a new task would inherit the old one's name in logs and scripts.
        cur = self._db.execute(
            "INSERT INTO tasks (id, spec, state, kind, reason, restarts, created_unix_s, updated_unix_s, counters)"
            " SELECT max(coalesce((SELECT max(id) FROM tasks), 0),"
            " coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key='last_id'), 0)) + 1,"
            " ?, ?, ?, ?, ?, ?, ?, ?",
            (
                json.dumps(asdict(replace(rec.spec, args=public))),
                rec.state.value,
                rec.kind,
                rec.reason,
                rec.restarts,
                rec.created_unix_s,
                rec.updated_unix_s,
                json.dumps(asdict(rec.counters)),
            ),
        )
        task_id = str(cur.lastrowid)
        self._secrets.write(task_id, secret)  # empty: removes a file an uncommitted insert of this id left
        return task_id

    def save(self, recs: list[TaskRecord], gpu: int | None = None, gpu_counters: Counters | None = None) -> None:
        """Write the records (and the GPU ledger) in one transaction; RegistryWriteError if it cannot."""
        try:
            self._save(recs, gpu, gpu_counters)
        except sqlite3.Error as exc:
            raise RegistryWriteError(f"writing {self.path} failed: {exc}") from exc

    def _save(self, recs: list[TaskRecord], gpu: int | None, gpu_counters: Counters | None) -> None:
        with self._tx():
            self._db.executemany(
                "UPDATE tasks SET state=?, reason=?, restarts=?, updated_unix_s=?, counters=?, progress=?,"
                " checkpoint_steps=?, step_estimate_ns=?, peak_memory_bytes=? WHERE id=?",
                [
                    (
                        r.state.value,
                        r.reason,
                        r.restarts,
                        r.updated_unix_s,
                        json.dumps(asdict(r.counters)),
                        json.dumps(r.progress),
                        r.checkpoint_steps,
                        r.step_estimate_ns,
                        r.peak_memory_bytes,
                        int(r.id),
                    )
                    for r in recs
                ],
            )
            if gpu is not None and gpu_counters is not None:
                self._db.execute(
                    "INSERT INTO ledger VALUES (?, ?) ON CONFLICT(gpu) DO UPDATE SET counters=excluded.counters",
                    (gpu, json.dumps(asdict(gpu_counters))),
                )

    def delete(self, ids: list[str]) -> None:
        """Remove these tasks' rows in one transaction (their ids are never given out again);
        RegistryWriteError if it cannot."""
        if not ids:
            return
        try:
            with self._tx():
                self._db.executemany("DELETE FROM tasks WHERE id=?", [(int(i),) for i in ids])
                self._db.execute(
                    "INSERT INTO meta VALUES ('last_id', ?) ON CONFLICT(key) DO UPDATE"
                    " SET value=max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
                    (max(int(i) for i in ids),),
                )
        except sqlite3.Error as exc:
            raise RegistryWriteError(f"writing {self.path} failed: {exc}") from exc
        self._secrets.remove(ids)

    def load(self) -> list[TaskRecord]:
        try:
            return self._load()
        except (ValueError, TypeError, KeyError, UnicodeError, sqlite3.OperationalError) as exc:
            raise _RowError(f"a task row is corrupt: {exc}") from exc

    def _load(self) -> list[TaskRecord]:
        rows = self._db.execute(
            "SELECT id, spec, state, kind, reason, restarts, created_unix_s, updated_unix_s, counters, progress,"
            " checkpoint_steps, step_estimate_ns, peak_memory_bytes FROM tasks ORDER BY id"
        ).fetchall()
        return [
            self._parked_if_secrets_unreadable(TaskRecord(
                id=str(r[0]),
                spec=TaskSpec(**json.loads(r[1])),
                state=TaskState(r[2]),
                kind=r[3],
                reason=r[4],
                restarts=r[5],
                created_unix_s=r[6],
                updated_unix_s=r[7],
                counters=Counters(**json.loads(r[8])),
                progress=json.loads(r[9]),
                checkpoint_steps=r[10],
                step_estimate_ns=r[11],
                peak_memory_bytes=r[12],
            ))
            for r in rows
        ]

    def _parked_if_secrets_unreadable(self, rec: TaskRecord) -> TaskRecord:
        """The record with its secret arguments put back; FAILED (its arguments masked) when its secrets file
        cannot be read: one task's file must not keep the agent, every other task and the ledger from starting."""
        try:
            secret = self._secrets.read(rec.id)
        except SecretFileError as exc:
            reason = self._secrets.unreadable_reason(rec.id, exc)
            if rec.id not in self._parked:  # (the rows are read twice at a start: checked at open, then loaded)
                self._parked.add(rec.id)
                log.error("task %s is FAILED: %s", rec.id, reason)
            return replace(rec, state=TaskState.FAILED, reason=reason)
        return replace(rec, spec=replace(rec.spec, args={**rec.spec.args, **secret})) if secret else rec

    def ledger_gpus(self) -> list[int]:
        """The GPUs with a ledger row here (one per agent that used this state directory)."""
        return [gpu for (gpu,) in self._db.execute("SELECT gpu FROM ledger ORDER BY gpu").fetchall()]

    def load_ledger(self, gpu: int) -> Counters:
        try:
            row = self._db.execute("SELECT counters FROM ledger WHERE gpu=?", (gpu,)).fetchone()
            return Counters(**json.loads(row[0])) if row else Counters()
        except (ValueError, TypeError, UnicodeError, sqlite3.OperationalError) as exc:
            raise _RowError(f"the ledger row of GPU {gpu} is corrupt: {exc}") from exc

    def _tx(self) -> _Tx:
        return _Tx(self._db)


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return
            except sqlite3.Error:
                self._rollback()  # a failed COMMIT (disk full) leaves the transaction open: the next BEGIN would fail
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

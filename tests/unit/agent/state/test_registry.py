"""Specification of the persistent task registry and harvest ledger (a real SQLite file)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.state.registry import SCHEMA_VERSION, Registry, RegistryError
from freeride.errors import FreerideError


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def registry(db_path: Path):  # type: ignore[no-untyped-def]
    reg = Registry(db_path)
    yield reg
    reg.close()


def new_record(name: str = "t", **spec_kwargs: object) -> TaskRecord:
    return TaskRecord(
        id="",
        spec=TaskSpec(name=name, ref=f"pkg.mod:{name}", **spec_kwargs),  # type: ignore[arg-type]
        state=TaskState.SUBMITTED,
        kind="iterative",
        created_unix_s=1_700_000_000.5,
        updated_unix_s=1_700_000_000.5,
    )


def full_record(task_id: str) -> TaskRecord:
    """A record with every persisted field set away from its default."""
    return TaskRecord(
        id=task_id,
        spec=TaskSpec(
            name="kmeans",
            ref="sidetasks.kmeans:KMeans",
            args={"k": "8", "seed": "3"},
            priority=7,
            mem_limit_bytes=256 * 2**20,
            max_restarts=2,
            checkpoint_interval_s=30.0,
            python="/opt/hf/bin/python",
        ),
        state=TaskState.RUNNING,
        kind="imperative",
        reason="restarted after a crash",
        restarts=2,
        created_unix_s=1_700_000_000.25,
        updated_unix_s=1_700_000_100.75,
        counters=Counters(
            steps=11, harvested_ns=12, overrun_ns=13, overrun_steps=14, windows=15,
            killed_steps=16, bubbles=17, bubble_ns=18, events=19,
        ),
        progress={"loss": 0.125, "items": 4096.0},
        checkpoint_steps=900,
        step_estimate_ns=1_500_000,
        peak_memory_bytes=123_456_789,
    )


def test_insert_returns_increasing_string_ids(registry: Registry) -> None:
    ids = [registry.insert(new_record(f"t{i}")) for i in range(3)]
    assert all(isinstance(i, str) for i in ids)
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)
    assert len(set(ids)) == 3


def test_inserted_record_loads_with_its_spec_and_state(registry: Registry) -> None:
    rec = new_record("a", args={"x": "1"}, priority=3)
    rec.id = registry.insert(rec)
    (loaded,) = registry.load()
    assert loaded == rec


def test_save_then_load_round_trips_every_persisted_field(registry: Registry) -> None:
    rec = full_record("")
    rec.id = registry.insert(rec)
    registry.save([rec])
    (loaded,) = registry.load()
    assert loaded == rec  # every field, compared as a whole
    assert loaded.spec.args == {"k": "8", "seed": "3"}
    assert loaded.state is TaskState.RUNNING
    assert loaded.counters == rec.counters
    assert loaded.progress == {"loss": 0.125, "items": 4096.0}
    assert loaded.checkpoint_steps == 900
    assert loaded.step_estimate_ns == 1_500_000
    assert loaded.peak_memory_bytes == 123_456_789
    assert loaded.reason == "restarted after a crash"
    assert loaded.restarts == 2


def test_a_row_written_before_tasks_had_their_own_interpreter_loads_with_the_agents(
        registry: Registry, db_path: Path) -> None:
    rec = new_record("old", python="/opt/hf/bin/python")
    rec.id = registry.insert(rec)
    registry.close()
    with sqlite3.connect(db_path) as db:  # the spec as an agent before `submit --python` wrote it
        old = {k: v for k, v in asdict(rec.spec).items() if k != "python"}
        db.execute("UPDATE tasks SET spec=? WHERE id=?", (json.dumps(old), rec.id))
    db.close()
    (loaded,) = Registry(db_path).load()
    assert loaded.spec.python == ""  # run by the agent's own interpreter, as it was
    assert loaded.spec == replace(rec.spec, python="")


def test_save_persists_later_changes_to_a_record(registry: Registry) -> None:
    rec = new_record("a")
    rec.id = registry.insert(rec)
    rec.state = TaskState.PAUSED
    rec.reason = "paused by user"
    rec.counters.steps = 5
    rec.progress = {"loss": 1.5}
    rec.updated_unix_s = 1_700_000_500.0
    registry.save([rec])
    (loaded,) = registry.load()
    assert loaded == rec


def test_save_updates_only_the_given_records(registry: Registry) -> None:
    first = new_record("a")
    first.id = registry.insert(first)
    second = new_record("b")
    second.id = registry.insert(second)
    second.state = TaskState.DONE
    second.reason = "finished"
    registry.save([second])
    by_id = {r.id: r for r in registry.load()}
    assert by_id[first.id].state is TaskState.SUBMITTED
    assert by_id[second.id].state is TaskState.DONE
    assert by_id[second.id].reason == "finished"


def test_load_returns_records_in_insertion_order(registry: Registry) -> None:
    ids = [registry.insert(new_record(f"t{i}")) for i in range(4)]
    assert [r.id for r in registry.load()] == ids
    assert [r.spec.name for r in registry.load()] == ["t0", "t1", "t2", "t3"]


def test_empty_registry_loads_no_records_and_zero_ledgers(registry: Registry) -> None:
    assert registry.load() == []
    assert registry.load_ledger(0) == Counters()


def test_ledger_round_trips_per_gpu(registry: Registry) -> None:
    registry.save([], gpu=0, gpu_counters=Counters(steps=1, harvested_ns=100))
    registry.save([], gpu=1, gpu_counters=Counters(steps=2, harvested_ns=200, bubbles=5))
    assert registry.load_ledger(0) == Counters(steps=1, harvested_ns=100)
    assert registry.load_ledger(1) == Counters(steps=2, harvested_ns=200, bubbles=5)
    assert registry.load_ledger(2) == Counters()


def test_saving_a_ledger_again_replaces_it(registry: Registry) -> None:
    registry.save([], gpu=0, gpu_counters=Counters(steps=1))
    registry.save([], gpu=0, gpu_counters=Counters(steps=9, windows=3))
    assert registry.load_ledger(0) == Counters(steps=9, windows=3)


def test_records_and_ledger_are_saved_together(registry: Registry) -> None:
    rec = new_record("a")
    rec.id = registry.insert(rec)
    rec.counters = Counters(steps=4)
    registry.save([rec], gpu=3, gpu_counters=Counters(steps=4))
    assert registry.load()[0].counters == Counters(steps=4)
    assert registry.load_ledger(3) == Counters(steps=4)


def test_reopening_the_file_keeps_tasks_and_ledger(db_path: Path) -> None:
    reg = Registry(db_path)
    rec = full_record("")
    task_id = rec.id = reg.insert(rec)
    reg.save([rec], gpu=0, gpu_counters=Counters(harvested_ns=42))
    reg.close()

    reopened = Registry(db_path)
    try:
        assert reopened.load() == [rec]
        assert reopened.load_ledger(0) == Counters(harvested_ns=42)
        assert int(reopened.insert(new_record("next"))) > int(task_id)
    finally:
        reopened.close()


def test_corrupt_file_raises_registry_error_that_says_to_move_it_aside(db_path: Path) -> None:
    db_path.write_bytes(b"this is not an SQLite database\x00\xff" * 200)
    with pytest.raises(RegistryError) as info:
        Registry(db_path)
    assert "move it aside" in str(info.value)
    assert str(db_path) in str(info.value)
    assert isinstance(info.value, FreerideError)


def test_schema_version_mismatch_raises_registry_error(db_path: Path) -> None:
    Registry(db_path).close()
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION + 1),))
    db.close()
    with pytest.raises(RegistryError) as info:
        Registry(db_path)
    assert f"schema {SCHEMA_VERSION + 1}" in str(info.value)
    assert str(SCHEMA_VERSION) in str(info.value)


URL = "redis://:hunter2-s3cret@redis-host:6379/0/pool"


def _every_byte_under(folder: Path, but: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and but not in p.parents)


def test_a_password_in_an_argument_stays_out_of_the_database_and_comes_back_on_load(db_path: Path) -> None:
    reg = Registry(db_path)
    task_id = reg.insert(new_record("p", args={"pool": URL, "n": "3"}))
    reg.close()
    secrets = db_path.parent / "secrets"
    # The database files (the -wal and -shm too) hold the URL masked, never the password.
    assert b"hunter2" not in _every_byte_under(db_path.parent, secrets)
    assert b"redis://:***@redis-host:6379/0/pool" in _every_byte_under(db_path.parent, secrets)
    (secret_file,) = secrets.iterdir()
    assert secret_file.name == f"task-{task_id}.json" and (secret_file.stat().st_mode & 0o777) == 0o600
    assert (secrets.stat().st_mode & 0o777) == 0o700
    reopened = Registry(db_path)
    assert reopened.load()[0].spec.args == {"pool": URL, "n": "3"}  # the worker gets the URL whole
    reopened.delete([task_id])
    assert not secret_file.exists()  # removed with its task
    reopened.close()


def test_an_argument_without_a_password_writes_no_secrets_file(db_path: Path) -> None:
    reg = Registry(db_path)
    reg.insert(new_record("q", args={"pool": "redis://redis-host/0/pool"}))
    reg.close()
    assert not (db_path.parent / "secrets").exists()


def test_a_password_an_older_freeride_stored_in_clear_is_moved_out_at_open(db_path: Path) -> None:
    Registry(db_path).close()
    db = sqlite3.connect(db_path)
    spec = json.dumps(asdict(TaskSpec(name="old", ref="pkg.mod:X", args={"pool": URL})))  # as it was stored
    db.execute("INSERT INTO tasks (id, spec, state, kind, created_unix_s, updated_unix_s, counters) VALUES "
               "(7, ?, 'READY', 'iterative', 1.0, 1.0, '{}')", (spec,))
    db.commit()
    db.close()
    reg = Registry(db_path)
    assert reg.load()[0].spec.args == {"pool": URL}
    (row,) = sqlite3.connect(db_path).execute("SELECT spec FROM tasks").fetchall()
    assert "hunter2" not in row[0] and "redis://:***@redis-host" in row[0]
    assert (db_path.parent / "secrets" / "task-7.json").exists()
    reg.close()


def test_a_secrets_file_that_cannot_be_written_stores_no_row(db_path: Path) -> None:
    (db_path.parent / "secrets").write_text("a file where the directory should be")
    reg = Registry(db_path)
    with pytest.raises(RegistryError, match="writing"):
        reg.insert(new_record("p", args={"pool": URL}))
    assert reg.load() == []  # the row was rolled back with it
    reg.close()


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b""])
def test_a_corrupt_secrets_file_parks_its_task_and_the_agent_still_starts(db_path: Path, content: bytes) -> None:
    """Round 3, item 5: it blamed the database and advised moving it aside, losing every task and the ledger."""
    reg = Registry(db_path)
    broken = reg.insert(new_record("p", args={"pool": URL}))
    fine = reg.insert(new_record("q", args={"pool": URL.replace("hunter2", "other")}))
    reg.save([replace(r, state=TaskState.READY) for r in reg.load()])
    reg.close()
    path = db_path.parent / "secrets" / f"task-{broken}.json"
    path.write_bytes(content)
    reg = Registry(db_path)  # no RegistryError
    try:
        loaded = {r.id: r for r in reg.load()}
        assert loaded[fine].state is TaskState.READY and "other" in loaded[fine].spec.args["pool"]
        parked = loaded[broken]
        assert parked.state is TaskState.FAILED
        assert str(path) in parked.reason and f"freeride rm {broken}" in parked.reason, parked.reason
        assert "hunter2" not in json.dumps(parked.spec.args)
        assert path.read_bytes() == content, "the file was changed: it is the operator's to inspect"
    finally:
        reg.close()

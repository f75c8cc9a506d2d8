"""Specification of retention: which finished tasks go, what of them is removed, and the agent's timer.

In-process: a real registry (SQLite in a temp dir) behind the real store, a fake wall clock and manual
timers; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from support.engine_fakes import ManualTimers, in_loop

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.engine.retention import Retention, expired, next_pass_s, regular_files, task_files
from freeride.agent.engine.tasks import TaskRuntime, TaskTable
from freeride.agent.state.registry import Registry, RegistryWriteError
from freeride.agent.state.store import Store
from freeride.core.units import format_duration, parse_duration, parse_retention
from freeride.errors import InvalidSpecError, InvalidStateError

DAY_S = 86400.0
NOW_S = 1_700_000_000.0


def rec(task_id: str, state: TaskState, age_s: float, created_age_s: float | None = None) -> TaskRecord:
    """A record last changed `age_s` ago, created `created_age_s` ago (default: then too)."""
    created = age_s if created_age_s is None else created_age_s
    return TaskRecord(task_id, TaskSpec(f"t{task_id}", "m:T"), state, created_unix_s=NOW_S - created,
                      updated_unix_s=NOW_S - age_s)


# -- the rule --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 7 * DAY_S), ("2w", 14 * DAY_S), ("1.5h", 5400), ("0", 0),
    (" 7D ", 7 * DAY_S),
])
def test_durations_are_a_number_and_one_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7x", "d", "-1d", "1h30m", "1e3s", "", "seven days", "7 d"])
def test_anything_else_is_refused_with_what_to_write(text: str) -> None:
    with pytest.raises(InvalidSpecError, match=r"bad duration .*like 30m, 12h or 7d"):
        parse_duration(text)


def test_retention_is_forever_unless_given_and_never_shorter_than_a_minute() -> None:
    assert parse_retention("forever") is None and parse_retention("0") is None
    assert parse_retention("7d") == 7 * DAY_S
    with pytest.raises(InvalidSpecError, match="too short"):
        parse_retention("30s")
    assert [format_duration(s) for s in (7 * DAY_S, 5400, 3600, 90, 2.5)] == ["1w", "90m", "1h", "90s", "2.5s"]


def test_only_finished_tasks_last_changed_longer_ago_than_the_period_expire_oldest_first() -> None:
    records = [
        rec("1", TaskState.DONE, 8 * DAY_S), rec("2", TaskState.FAILED, 6 * DAY_S),
        rec("3", TaskState.CANCELLED, 30 * DAY_S), rec("4", TaskState.PAUSED, 30 * DAY_S),
        rec("5", TaskState.READY, 30 * DAY_S), rec("6", TaskState.DONE, 7 * DAY_S),  # exactly 7 days: kept
    ]
    assert [r.id for r in expired(records, NOW_S, 7 * DAY_S)] == ["3", "1"]
    assert [r.id for r in expired(records, NOW_S, 7 * DAY_S, {TaskState.DONE})] == ["1"]
    assert [r.id for r in expired(records, NOW_S, 0)] == ["3", "1", "6", "2"]
    assert expired(records, NOW_S, 0, {TaskState.PAUSED}) == []  # never an unfinished one


def test_age_is_the_time_since_the_last_change_not_since_creation() -> None:
    records = [
        rec("1", TaskState.DONE, age_s=DAY_S, created_age_s=30 * DAY_S),  # submitted long ago, finished yesterday
        rec("2", TaskState.FAILED, age_s=8 * DAY_S, created_age_s=8 * DAY_S),
        rec("3", TaskState.CANCELLED, age_s=9 * DAY_S, created_age_s=9 * DAY_S + 1),
    ]
    assert [r.id for r in expired(records, NOW_S, 7 * DAY_S)] == ["3", "2"]
    # The next pass: at task 1's expiry (6 days away, capped to the hour), not at once as its creation says.
    assert next_pass_s(records[:1], NOW_S, 7 * DAY_S) == 3600
    assert next_pass_s([rec("1", TaskState.DONE, age_s=600, created_age_s=DAY_S)], NOW_S, 1800) == 1200


def test_the_next_pass_is_at_the_next_expiry_and_at_most_an_hour_or_the_period_away() -> None:
    assert next_pass_s([rec("1", TaskState.DONE, 2 * DAY_S)], NOW_S, 7 * DAY_S) == 3600  # hourly
    assert next_pass_s([rec("1", TaskState.DONE, 1790)], NOW_S, 1800) == 10  # its expiry
    assert next_pass_s([], NOW_S, 600) == 600  # a task finishing now expires no sooner
    assert next_pass_s([rec("1", TaskState.READY, 1790)], NOW_S, 1800) == 1800  # unfinished: no expiry
    assert next_pass_s([rec("1", TaskState.DONE, 5000)], NOW_S, 1800) == 1.0  # overdue (its worker exits): soon


def test_a_tasks_files_are_its_checkpoint_and_logs_and_nothing_else(tmp_path: Path) -> None:
    mine = ["checkpoints/task-1.ckpt", "checkpoints/task-1.ckpt.tmp", "logs/task-1.log", "logs/task-1.log.1"]
    others = ["checkpoints/task-10.ckpt", "checkpoints/task-1.ckptx", "logs/task-11.log", "logs/task-1", "task-1.log",
              "logs/other-task-1.log"]
    for name in mine + others:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 10)
    found = task_files(tmp_path, "1")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in found) == sorted(mine)
    (tmp_path / "logs" / "task-1.log.2").symlink_to(tmp_path / "task-1.log")  # a link stays, and its target
    (tmp_path / "logs" / "task-1.log.3").mkdir()
    assert regular_files(task_files(tmp_path, "1"), unlink=True) == (4, 40)
    assert all((tmp_path / name).exists() for name in others)
    assert (tmp_path / "logs" / "task-1.log.2").is_symlink() and (tmp_path / "logs" / "task-1.log.3").is_dir()
    assert task_files(tmp_path / "nowhere", "1") == []


# -- removing, with the real store and registry ----------------------------------------------------
class Rig:
    def __init__(self, state_dir: Path, keep_s: float | None = None,
                 on_freed: Callable[[], None] | None = None) -> None:
        self.state_dir = state_dir
        self.registry = Registry(state_dir / "freeride.db")
        self.timers = ManualTimers()
        self.now_s = NOW_S
        self.table = TaskTable(lambda r, change: None, wall_clock=lambda: self.now_s)
        self.store = Store(self.registry, 0, state_dir, self.table.snapshot, Counters,
                           call_later=self.timers.call_later)
        self.retention = Retention(self.table, self.store, state_dir, keep_s, self.timers.call_later,
                                   wall_clock=lambda: self.now_s, exit_timeout_s=0.01, on_freed=on_freed)

    async def add(self, state: TaskState, age_s: float, created_age_s: float | None = None) -> TaskRecord:
        r = rec("", state, age_s, created_age_s)
        r.id = await self.store.insert(r)
        self.table.records[r.id] = r
        await self.store.write(r.id)
        for name in (f"checkpoints/task-{r.id}.ckpt", f"logs/task-{r.id}.log", f"logs/task-{r.id}.log.1"):
            (self.state_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.state_dir / name).write_bytes(b"x" * 100)
        return r

    def on_disk(self) -> list[str]:
        return sorted(r.id for r in Registry(self.state_dir / "freeride.db").load())

    def files(self) -> list[str]:
        return sorted(p.name for p in self.state_dir.glob("*/task-*"))

    async def close(self) -> None:
        await self.retention.close()
        await self.store.close(set(self.table.records))
        self.registry.close()


@in_loop
async def test_rm_removes_a_finished_task_its_row_and_its_files_and_refuses_an_unfinished_one(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    done, live = await rig.add(TaskState.DONE, 10), await rig.add(TaskState.READY, 10)
    removal = await rig.retention.remove(done)
    assert [r.id for r in removal.tasks] == [done.id] and (removal.files, removal.bytes) == (3, 300)
    assert list(rig.table.records) == [live.id]
    assert rig.files() == [f"task-{live.id}.ckpt", f"task-{live.id}.log", f"task-{live.id}.log.1"]
    with pytest.raises(InvalidStateError, match=f"task {live.id} is READY; cancel it first"):
        await rig.retention.remove(live)
    await rig.close()
    assert rig.on_disk() == [live.id]  # the final write did not bring it back


@in_loop
async def test_a_removed_id_is_never_given_out_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first, last = await rig.add(TaskState.DONE, 10), await rig.add(TaskState.DONE, 10)
    await rig.retention.remove(last)
    await rig.retention.remove(first)
    new = await rig.add(TaskState.SUBMITTED, 0)
    assert int(new.id) == int(last.id) + 1
    await rig.close()
    reopened = Registry(tmp_path / "freeride.db")
    assert int(reopened.insert(new)) == int(last.id) + 2
    reopened.close()


@in_loop
async def test_a_task_whose_worker_still_exits_is_refused_by_rm_and_skipped_by_prune(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    cancelled = await rig.add(TaskState.CANCELLED, 10)
    rig.table.live[cancelled.id] = TaskRuntime(spawning=True)  # (no worker to wait for; still there)
    with pytest.raises(InvalidStateError, match="has not exited yet"):
        await rig.retention.remove(cancelled)
    assert (await rig.retention.prune(0)).tasks == []
    del rig.table.live[cancelled.id]
    assert [r.id for r in (await rig.retention.prune(0)).tasks] == [cancelled.id]
    await rig.close()


@in_loop
async def test_prune_by_age_and_state_a_dry_run_removes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    old_done = await rig.add(TaskState.DONE, 8 * DAY_S)
    old_failed = await rig.add(TaskState.FAILED, 9 * DAY_S)
    new_done = await rig.add(TaskState.DONE, DAY_S)
    paused = await rig.add(TaskState.PAUSED, 30 * DAY_S)
    dry = await rig.retention.prune(7 * DAY_S, dry_run=True)
    assert dry.dry_run and [r.id for r in dry.tasks] == [old_failed.id, old_done.id] and dry.files == 6
    assert len(rig.table.records) == 4 and len(rig.files()) == 12
    only_done = await rig.retention.prune(7 * DAY_S, {TaskState.DONE})
    assert [r.id for r in only_done.tasks] == [old_done.id] and only_done.bytes == 300
    assert sorted(rig.table.records) == sorted([old_failed.id, new_done.id, paused.id])
    with pytest.raises(InvalidSpecError, match=r"finished tasks only .* not PAUSED"):
        await rig.retention.prune(0, {TaskState.PAUSED})
    with pytest.raises(InvalidSpecError, match=">= 0"):
        await rig.retention.prune(-1)
    await rig.close()
    assert rig.on_disk() == sorted([old_failed.id, new_done.id, paused.id])


@in_loop
async def test_prune_goes_by_the_last_change_a_long_running_task_finished_lately_stays(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    finished_lately = await rig.add(TaskState.DONE, age_s=DAY_S, created_age_s=30 * DAY_S)
    finished_long_ago = await rig.add(TaskState.CANCELLED, age_s=8 * DAY_S, created_age_s=8 * DAY_S)
    created_lately = await rig.add(TaskState.FAILED, age_s=10 * DAY_S, created_age_s=DAY_S)  # (a clock set back)
    removal = await rig.retention.prune(7 * DAY_S)
    assert [r.id for r in removal.tasks] == [created_lately.id, finished_long_ago.id]
    assert list(rig.table.records) == [finished_lately.id]
    assert rig.files() == [f"task-{finished_lately.id}.ckpt", f"task-{finished_lately.id}.log",
                           f"task-{finished_lately.id}.log.1"]
    await rig.close()
    assert rig.on_disk() == [finished_lately.id]


@in_loop
async def test_files_go_before_the_row_so_that_a_full_disk_can_be_freed_and_the_space_freed_is_announced(
    tmp_path: Path,
) -> None:
    freed: list[int] = []
    rig = Rig(tmp_path, on_freed=lambda: freed.append(len(rig.files())))
    done = await rig.add(TaskState.DONE, 10)
    real_delete = rig.registry.delete
    files_at_delete: list[list[str]] = []

    def delete(ids: list[str]) -> None:  # SQLite needs space to delete a row: the files' space must be back first
        files_at_delete.append(rig.files())
        real_delete(ids)

    rig.registry.delete = delete  # type: ignore[method-assign]
    removal = await rig.retention.remove(done)
    assert (removal.files, files_at_delete, freed) == (3, [[]], [0])  # files gone before the row; announced once
    assert rig.on_disk() == [] and list(rig.table.records) == []
    await rig.close()


@in_loop
async def test_a_row_the_database_still_refuses_keeps_the_task_listed_and_says_its_files_are_gone(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    done = await rig.add(TaskState.DONE, 10)
    real_delete = rig.registry.delete

    def full(ids: list[str]) -> None:
        raise RegistryWriteError("writing freeride.db failed: database or disk is full")

    rig.registry.delete = full  # type: ignore[method-assign]
    with pytest.raises(InvalidStateError, match=r"disk is full.*then remove the tasks again.*3 file\(s\), 300 bytes, "
                                                r"are removed already"):
        await rig.retention.remove(done)
    assert list(rig.table.records) == [done.id] and rig.files() == []  # listed, its files gone
    rig.registry.delete = real_delete  # type: ignore[method-assign]
    removal = await rig.retention.remove(done)  # again, once the database can be written: the row goes
    assert [r.id for r in removal.tasks] == [done.id] and removal.files == 0 and rig.on_disk() == []
    await rig.close()


@in_loop
async def test_the_agents_retention_prunes_at_start_then_at_each_expiry_and_stops_at_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "freeride.agent")
    rig = Rig(tmp_path, keep_s=DAY_S)
    await rig.add(TaskState.DONE, 2 * DAY_S)
    young = await rig.add(TaskState.CANCELLED, DAY_S - 600)  # expires in 10 minutes
    running = await rig.add(TaskState.READY, 5 * DAY_S)
    await rig.retention.start()
    assert sorted(rig.table.records) == sorted([young.id, running.id])
    assert "retention pass: removed 1 finished task(s) older than 1d" in caplog.text
    (timer,) = rig.timers.pending()
    assert timer.at == 600  # at the young task's expiry, not in an hour
    rig.now_s += 601
    rig.timers.fire_next()
    await asyncio.sleep(0)  # (the pass runs as an owned task: let it start)
    await rig.retention.close()  # waits for the pass under way
    assert list(rig.table.records) == [running.id]
    assert rig.files() == [f"task-{running.id}.ckpt", f"task-{running.id}.log", f"task-{running.id}.log.1"]
    assert not rig.timers.pending()  # closed: the pass did not arm another
    await rig.close()
    assert rig.on_disk() == [running.id]


@in_loop
async def test_without_a_retention_period_nothing_is_pruned_and_no_timer_is_set(tmp_path: Path) -> None:
    rig = Rig(tmp_path, keep_s=None)
    await rig.add(TaskState.DONE, 365 * DAY_S)
    await rig.retention.start()
    assert len(rig.table.records) == 1 and not rig.timers.pending()
    await rig.close()


@in_loop
async def test_rm_refuses_every_unfinished_task_paused_included_and_keeps_its_files(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    unfinished = [await rig.add(state, 30 * DAY_S) for state in
                  (TaskState.SUBMITTED, TaskState.STARTING, TaskState.READY, TaskState.RUNNING, TaskState.PAUSED)]
    for rec in unfinished:
        with pytest.raises(InvalidStateError) as err:
            await rig.retention.remove(rec)
        assert str(err.value) == (f"task {rec.id} is {rec.state.value}; cancel it first "
                                  f"(`freeride cancel {rec.id}`), then remove it")
    assert len(rig.table.records) == 5 and len(rig.files()) == 15
    await rig.close()

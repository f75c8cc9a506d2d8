"""The task logs' total budget (freeride.agent.procs.logbudget): the least recently written output goes first.

In-process: real files in a temp dir, a clock the test sets; then the real log writer thread with pipes
written here standing in for workers.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from freeride.agent.procs.logbudget import TaskLogBudget
from freeride.agent.procs.task_logs import TaskLogs, rotated


def _file(path: Path, size: int, mtime_s: int) -> Path:
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime_s, mtime_s))
    return path


def test_over_the_budget_the_least_recently_written_files_go_first_down_to_seven_eighths(tmp_path: Path) -> None:
    oldest = _file(tmp_path / "task-1.log.1", 300, 1000)
    old = _file(tmp_path / "task-1.log", 300, 2000)
    other = _file(tmp_path / "task-2.log", 300, 3000)
    not_a_log = _file(tmp_path / "notes.txt", 5000, 1)  # not a task's log: neither counted nor removed
    now = [4_000 * 10**9]
    budget = TaskLogBudget(tmp_path, total_bytes=1000, clock_ns=lambda: now[0])
    closed: list[Path] = []
    budget.wrote(tmp_path / "task-3.log", 100)  # the first write lists what earlier runs left: 1000 in all
    assert budget.used_bytes == 1000 and budget.enforce(closed.append) == (0, 0)  # at the budget: nothing goes
    _file(tmp_path / "task-3.log", 200, 4000)
    budget.wrote(tmp_path / "task-3.log", 100)  # 1100 > 1000: down to 875, oldest first
    assert budget.enforce(closed.append) == (1, 300)
    assert closed == [oldest] and not oldest.exists() and old.exists() and other.exists() and not_a_log.exists()
    assert budget.used_bytes == 800


def test_what_was_removed_meanwhile_is_seen_before_anything_else_goes(tmp_path: Path) -> None:
    a = _file(tmp_path / "task-1.log", 600, 1000)
    b = _file(tmp_path / "task-2.log", 500, 2000)
    budget = TaskLogBudget(tmp_path, total_bytes=1000)
    budget.rescan()
    a.unlink()  # freeride rm of task 1, behind the writer's back
    budget.wrote(b, 0)
    assert budget.enforce(lambda p: None) == (0, 0) and b.exists()  # 500 on disk: under the budget
    assert budget.used_bytes == 500


def test_a_rotation_drops_the_older_part_from_the_count(tmp_path: Path) -> None:
    budget = TaskLogBudget(tmp_path, total_bytes=1 << 20)
    path = tmp_path / "task-1.log"
    for _ in range(3):
        budget.wrote(path, 100)
        os.replace(_file(path, 100, 1), rotated(path))
        budget.renamed(path, rotated(path))
    assert budget.used_bytes == 100  # one rotated part of 100, the rest replaced


def test_the_writer_keeps_every_tasks_logs_together_under_the_total_newest_output_kept(tmp_path: Path) -> None:
    """Five tasks each print 2.5x their cap (so each rotates); the total is 3 caps: the logs on disk never
    hold more, the last task's newest output is there, and the first task's output went first."""
    cap, total = 8192, 3 * 8192

    async def main() -> None:
        logs = TaskLogs(tmp_path, max_bytes=cap, total_bytes=total)
        try:
            for task in range(1, 6):
                r, w = logs.pipe(str(task))
                for i in range(20):  # 20 x 1 KiB: 2.5 caps, in pieces the writer takes one by one
                    os.write(w, (b"%d:%02d " % (task, i)).ljust(1023, b".") + b"\n")
                os.close(w)
                await logs.drain(r)
                on_disk = sum(p.stat().st_size for p in tmp_path.glob("task-*.log*"))
                assert on_disk <= total, (task, on_disk)
        finally:
            logs.close()

    asyncio.run(main())
    names = sorted(p.name for p in tmp_path.glob("task-*.log*"))
    assert "task-1.log" not in names and "task-1.log.1" not in names  # the oldest output went first
    assert (tmp_path / "task-5.log").read_bytes().endswith(b"\n") and b"5:19 " in (tmp_path / "task-5.log").read_bytes()


def test_a_file_still_being_written_is_closed_before_it_goes_and_output_goes_on_in_a_new_one(tmp_path: Path) -> None:
    """One task alone over the total (its cap times two is the total): its current file goes only when it is the
    least recently written one; the writer closes it first, so no space stays held by an open, unlinked file."""
    cap = 4096

    async def main() -> tuple[list[str], bytes]:
        logs = TaskLogs(tmp_path, max_bytes=cap, total_bytes=2 * cap)
        try:
            quiet_r, quiet_w = logs.pipe("1")
            os.write(quiet_w, b"q" * 4000 + b"\n")  # task 1 writes once and stays open, quiet
            await logs.drain(quiet_r)
            loud_r, loud_w = logs.pipe("2")
            for i in range(5):  # task 2: 5 x 1 KiB, the total is passed: task 1's open file is the oldest
                os.write(loud_w, (b"%d " % i).ljust(1023, b"-") + b"\n")
            await logs.drain(loud_r)
            held = _deleted_but_open(tmp_path)  # while both pipes are open
            os.write(quiet_w, b"after\n")  # its next output starts a new file
            await logs.drain(quiet_r)
            os.close(quiet_w)
            os.close(loud_w)
            await logs.drain(quiet_r)
            await logs.drain(loud_r)
        finally:
            logs.close()
        return held, (tmp_path / "task-1.log").read_bytes()

    held, quiet = asyncio.run(main())
    assert held == [] and quiet == b"after\n"


def _deleted_but_open(folder: Path) -> list[str]:
    """Files under `folder` this process holds open although they were removed (their space is not freed)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)) and target.endswith(" (deleted)"):
            out.append(target)
    return out

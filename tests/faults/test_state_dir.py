"""The state directory fails: a corrupt database, or a disk that fills up while the agent runs.

A corrupt database stops the agent before it serves, with one line saying what to do, and the
file is left exactly as it was (the ledger in it is the operator's to rescue). A full disk is
simulated for real at the kernel: the test lowers the running agent's RLIMIT_FSIZE (prlimit), so
every write to a regular file fails with EFBIG the way it fails with ENOSPC on a full disk (same
SQLite path, different errno). The agent keeps serving bubbles, keeps the ledger in memory,
refuses submissions with FAILED_PRECONDITION, retries, and writes everything once it can; if
it must stop before that, it exits with an error instead of 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from support.agents import BackgroundTrainer
from support.faults import assert_all_reaped, assert_no_tracebacks, durable, ref, tagged_agent

from freeride.errors import InvalidStateError
from freeride.tooling.harness import WindowCollector, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2
PAGE = 4096


@pytest.fixture(scope="module")
def used_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state directory of an agent that ran a task through some bubbles and stopped cleanly."""
    root = tmp_path_factory.mktemp("used")
    agent = tagged_agent(root / "state").start()
    try:
        with agent.client() as c, WindowCollector(c) as windows, BackgroundTrainer(agent, [10.0]):
            wait_for_task(c, c.submit(S.TaskSpec(ref=ref("behaviours", "Counter"))).id, [S.TASK_STATE_READY])
            assert windows.wait_for(5, 30)
    finally:
        assert agent.stop() == 0
        assert_all_reaped(agent.tag)
    return agent.state_dir


def garbage(db: bytes) -> bytes:
    return bytes((i * 7919) % 251 for i in range(len(db)))


def torn_page(db: bytes) -> bytes:  # a page in the middle of the file overwritten (a torn write)
    return db[: 2 * PAGE] + garbage(db[:PAGE]) + db[3 * PAGE:]


def truncated(db: bytes) -> bytes:
    return db[: len(db) // 2 // PAGE * PAGE + 100]


def flipped_row(db: bytes) -> bytes:  # SQLite has no checksums: a flipped byte inside a row goes unnoticed by it
    at = db.index(b'"harvested_ns": ') + len(b'"harvested_ns": ')
    return db[:at] + b"\xff" + db[at + 1:]


@pytest.mark.parametrize("corrupt", [garbage, torn_page, truncated, flipped_row], ids=lambda f: f.__name__)
def test_a_corrupt_database_stops_the_agent_with_one_line_and_is_left_untouched(
    corrupt: Callable[[bytes], bytes], used_state: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    shutil.copytree(used_state, state)
    db = state / "freeride.db"
    assert not (state / "freeride.db-wal").exists()  # checkpointed on the clean stop: the file is the ledger
    db.write_bytes(corrupt(db.read_bytes()))
    damaged = db.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "freeride", "agent", "--state-dir", str(state), "--socket", str(tmp_path / "a.sock")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"state database {db} is unreadable" in lines[0] and "move it aside" in lines[0]
    assert db.read_bytes() == damaged  # refused, not "repaired" into an empty ledger
    assert not (tmp_path / "a.sock").exists()  # it never served


def fill_disk(agent_pid: int, full: bool) -> None:
    """Every write to a regular file by the agent fails (EFBIG) from now on, or works again."""
    soft = 1 if full else psutil.RLIM_INFINITY  # the soft limit only: lowering the hard one could not be undone
    psutil.Process(agent_pid).rlimit(psutil.RLIMIT_FSIZE, (soft, psutil.RLIM_INFINITY))


def test_a_full_disk_keeps_bubbles_served_refuses_submissions_and_loses_nothing_once_it_drains(tmp_path: Path) -> None:
    agent = tagged_agent(tmp_path / "state").start()
    assert agent.proc is not None
    try:
        with agent.client() as c, WindowCollector(c) as windows, BackgroundTrainer(agent, [10.0]):
            task = c.submit(S.TaskSpec(ref=ref("behaviours", "Counter")))
            wait_for_task(c, task.id, [S.TASK_STATE_READY])
            assert windows.wait_for(5, 30)
            fill_disk(agent.proc.pid, full=True)
            full_from = len(windows.windows)
            assert windows.wait_for(full_from + 30, 30)  # bubbles are still served while nothing can be written
            with pytest.raises(InvalidStateError) as err:  # (FAILED_PRECONDITION on the wire)
                c.submit(S.TaskSpec(ref=ref("behaviours", "Counter")))
            assert "state database cannot be written" in str(err.value)
            during = c.stats()
            ledger, _ = durable(agent.state_dir)
            assert ledger.windows < during.gpu.windows  # the disk really refused the ledger...
            assert during.gpu.harvested_s > ledger.harvested_ns / 1e9  # ...and the agent kept counting in memory
            assert [t.id for t in during.tasks] == [task.id]  # the refused submission left no trace
            fill_disk(agent.proc.pid, full=False)
        last = during
        code = agent.stop()
        assert code == 0, agent.log_tail()
        ledger, _ = durable(agent.state_dir)
        assert ledger.windows >= last.gpu.windows and ledger.harvested_ns / 1e9 >= last.gpu.harvested_s
        assert "writable again after" in agent.log_path.read_text()
        assert_no_tracebacks(agent)
    finally:
        agent.stop()
        assert_all_reaped(agent.tag)


def test_stopping_while_the_disk_is_still_full_is_an_error_exit_not_a_silent_one(tmp_path: Path) -> None:
    agent = tagged_agent(tmp_path / "state").start()
    assert agent.proc is not None
    try:
        with agent.client() as c, WindowCollector(c) as windows, BackgroundTrainer(agent, [10.0]):
            wait_for_task(c, c.submit(S.TaskSpec(ref=ref("behaviours", "Counter"))).id, [S.TASK_STATE_READY])
            fill_disk(agent.proc.pid, full=True)
            assert windows.wait_for(10, 30)
        assert agent.stop() == 1  # systemd (Restart=on-failure) and operators see it: the last state was not saved
        assert_no_tracebacks(agent)
    finally:
        agent.stop()
        assert_all_reaped(agent.tag)

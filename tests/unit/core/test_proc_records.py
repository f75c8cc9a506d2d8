"""A worker's record of its processes (freeride.core.proc_records) and the worker's own use of it once its agent
is gone (freeride.worker.leftovers)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from freeride.core.proc_records import RECORD_ENV, kill, read
from freeride.worker.leftovers import kill_own_leftovers, own_leftovers

_SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    p = subprocess.Popen(_SLEEP)
    yield psutil.Process(p.pid)
    p.kill()
    p.wait()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_recorded_pid_whose_start_time_no_longer_matches_is_never_killed(sleeper: psutil.Process) -> None:
    """The pid was reused: the process now holding it is not the one written down."""
    assert kill({sleeper.pid: sleeper.create_time() + 5.0}) == []
    assert _alive(sleeper), "a process holding a reused pid was killed"
    assert kill({sleeper.pid: sleeper.create_time()}) == [f"{sleeper.pid} ({sleeper.name()})"]
    sleeper.wait(10)


def test_a_record_reads_back_and_skips_what_does_not_parse(tmp_path: Path) -> None:
    path = tmp_path / "task-1-0-7"
    path.write_text("12 1700000000.25\nnot a line\n13 x\n14 1700000001.5\n")
    assert read(path) == {12: 1700000000.25, 14: 1700000001.5}
    assert read(tmp_path / "missing") == {}


def test_a_worker_that_lost_its_agent_kills_what_its_record_names_but_itself(tmp_path: Path,
                                                                              sleeper: psutil.Process) -> None:
    other = subprocess.Popen(_SLEEP)  # the worker here is `sleeper`; the task left `other` running
    try:
        left = psutil.Process(other.pid)
        record = tmp_path / "task-1-0-7"
        record.write_text(f"{sleeper.pid} {sleeper.create_time()!r}\n{left.pid} {left.create_time()!r}\n")
        environ = {RECORD_ENV: str(record)}
        assert own_leftovers(environ, sleeper.pid) == {left.pid: left.create_time()}
        assert kill_own_leftovers(environ, sleeper.pid) == [f"{left.pid} ({left.name()})"]
        other.wait(10)
        assert _alive(sleeper), "the worker killed itself before its exit"
    finally:
        other.kill()
        other.wait()

"""A worker's session weighs against training's at its placement's nice (freeride.core.cpu.lower_autogroup).

With autogroup scheduling on, CPU time is shared between sessions first and by nice only within one: a worker in a
session of its own, at nice 19 or SCHED_IDLE, still took a fair half of a core from a busy rank (round 3 of the
adversary: +46 % on the 2-core VM). Its autogroup's nice is raised to the placement's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride.core.cpu import Placement, lower_autogroup


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a session of its own, as a worker does."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                         start_new_session=True)
    try:
        yield p
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()


def test_only_a_session_leaders_autogroup_is_raised(tmp_path: Path, leader: subprocess.Popen[bytes]) -> None:
    (tmp_path / str(leader.pid)).mkdir()
    (tmp_path / str(leader.pid) / "autogroup").write_text("/autogroup-7 nice 0\n")
    assert not lower_autogroup(os.getpid() if os.getsid(0) != os.getpid() else leader.pid + 10**6, 19,
                               proc=tmp_path)  # not a session leader (or no such process): nothing written
    assert lower_autogroup(leader.pid, 19, proc=tmp_path)
    assert (tmp_path / str(leader.pid) / "autogroup").read_text() == "19"
    assert not lower_autogroup(leader.pid, 19, proc=tmp_path / "missing")  # no autogroup: nothing, no error
    (tmp_path / str(leader.pid) / "autogroup").write_text("/autogroup-7 nice 19\n")
    assert not lower_autogroup(leader.pid, 10, proc=tmp_path)  # never lowered (that would raise its priority)


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroup scheduling")
def test_a_spawned_workers_session_gets_the_placements_nice_on_this_kernel(
        leader: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREERIDE_WORKER_AUTOGROUP", "1")  # the product's default (the suite turns it off)
    Placement(nice=19, cpus=None, sched="other").start_at(leader.pid)
    assert Path(f"/proc/{leader.pid}/autogroup").read_text().split()[-1] == "19"
    own = Path("/proc/self/autogroup").read_text()
    follower = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:  # in this session: its autogroup is this test's own, never the worker's to change
        Placement(nice=19, cpus=None, sched="other").start_at(follower.pid)
        assert Path("/proc/self/autogroup").read_text() == own
    finally:
        assert follower.stdin is not None
        follower.stdin.close()
        follower.wait()

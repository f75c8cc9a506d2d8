"""The agent's bursty work off the control path runs at nice 19 (prune's deletions, the database's writes), while
the watchdog's reads keep the agent's priority; a process the agent spawns (a worker, a submit's check) is at
its placement from its interpreter's first instruction, not only once it applied the placement itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from freeride.agent.domain.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.agent.engine import retention
from freeride.agent.engine.offload import ThreadOffload
from freeride.agent.engine.retention import Retention
from freeride.agent.engine.tasks import TaskTable
from freeride.agent.state.registry import Registry
from freeride.agent.state.store import Store
from freeride.core.cpu import BACKGROUND_NICE, Placement

pytestmark = pytest.mark.skipif(os.getpriority(os.PRIO_PROCESS, 0) >= BACKGROUND_NICE,
                                reason="the suite already runs at nice 19: nothing to lower")


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_background_offload_thread_runs_at_nice_19_and_the_watchdogs_keeps_the_agents() -> None:
    async def both() -> tuple[int, int]:
        background, sampler = ThreadOffload("test-prune", background=True), ThreadOffload("test-sample")
        try:
            return await background.run(_own_nice), await sampler.run(_own_nice)
        finally:
            background.close()
            sampler.close()

    assert asyncio.run(both()) == (BACKGROUND_NICE, _own_nice())


def test_a_prunes_deletions_and_the_database_writes_run_at_nice_19(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def regular_files(paths: Iterable[Path], unlink: bool = False) -> tuple[int, int]:
        seen.append(_own_nice())
        return 0, 0

    monkeypatch.setattr(retention, "regular_files", regular_files)

    async def run() -> int:
        registry = Registry(tmp_path / "freeride.db")
        table = TaskTable(lambda r, change: None)
        store = Store(registry, 0, tmp_path, table.snapshot, Counters)
        try:
            r = TaskRecord("", TaskSpec("t", "m:T"), TaskState.DONE, updated_unix_s=0.0)
            r.id = await store.insert(r)
            table.records[r.id] = r
            await Retention(table, store, tmp_path, None, asyncio.get_running_loop().call_later).prune(0)
            return await store._run(_own_nice)
        finally:
            await store.close(set())
            registry.close()

    assert asyncio.run(run()) == BACKGROUND_NICE
    assert seen == [BACKGROUND_NICE]


def test_a_spawned_process_is_at_its_placement_before_it_runs_a_line_of_its_own() -> None:
    # The child never applies anything itself: only start_at, from outside, can have lowered it.
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        Placement(nice=BACKGROUND_NICE).start_at(proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == BACKGROUND_NICE
    finally:
        proc.communicate(b"")

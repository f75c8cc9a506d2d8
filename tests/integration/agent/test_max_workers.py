"""--max-workers with a real agent: more submits than the cap never make more resident worker processes than
the cap, the rest wait visibly (queued), and every one of them runs once workers exit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.agents import FAST, BackgroundTrainer, spec

from freeride.tooling.harness import AgentProcess, wait_for
from freeride.v1 import tasks_pb2

CAP, TASKS = 2, 6
QUEUED = f"queued: {CAP} workers resident (--max-workers {CAP})"


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=[*FAST, "--max-workers", str(CAP)]).start()
    try:
        yield agent
    finally:
        assert agent.stop() == 0, agent.log_tail()


def _workers(agent: AgentProcess) -> int:
    """Worker processes of the agent alive right now (an exited, unreaped one is no longer resident)."""
    assert agent.proc is not None
    alive = 0
    for child in psutil.Process(agent.proc.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "freeride.worker" in child.cmdline():
                alive += 1
        except psutil.NoSuchProcess:
            continue
    return alive


def test_submits_beyond_the_cap_wait_queued_and_all_run_after(capped: AgentProcess) -> None:
    with capped.client() as client:
        # No trainer yet, so no window: the first CAP tasks' workers start and wait, however long the submits take
        # on a busy machine, and the rest queue behind them.
        ids = [client.submit(spec("Counter", steps=100, step_ms=1)).id for _ in range(TASKS)]
        listed = {t.id: t for t in client.list()}
        queued = {i for i in ids if listed[i].reason == QUEUED}
        assert queued == set(ids[CAP:]), [listed[i].reason for i in ids]
        assert all(listed[i].state == tasks_pb2.TASK_STATE_SUBMITTED for i in queued)
        most = [_workers(capped)]
        done: set[str] = set()

        def on_event(ev: tasks_pb2.AgentEvent) -> bool | None:
            if not ev.HasField("task"):
                return None
            most.append(_workers(capped))  # sampled at every task change: each start and each end is one
            if ev.task.state == tasks_pb2.TASK_STATE_DONE:
                done.add(ev.task.id)
            return True if done >= set(ids) else None

        def now() -> bool | None:
            done.update(t.id for t in client.list() if t.state == tasks_pb2.TASK_STATE_DONE)
            return True if done >= set(ids) else None

        with BackgroundTrainer(capped, [20.0]):
            assert wait_for(client, now, on_event, timeout_s=60), f"not all done: {sorted(set(ids) - done)}"
    assert max(most) <= CAP, most

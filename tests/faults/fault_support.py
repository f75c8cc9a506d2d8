"""What every fault-injection case needs: tagged agents, a reaping check, and a ledger that must not shrink.

Every process an agent starts (workers, and whatever a task forks, however it detaches) inherits
the agent's environment. Each agent here gets a unique FREERIDE_FAULT_TAG, so "every process was
reaped" is checked without knowing any pid in advance: no live process may carry the tag.
"""

from __future__ import annotations

import os
import select
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import psutil

from freeride.client import AgentClient
from freeride.harness import AgentProcess
from freeride.v1 import tasks_pb2

TAG = "FREERIDE_FAULT_TAG"
FAST = ["--restart-backoff-s", "0.05", "--hang-timeout-s", "1", "--checkpoint-interval-s", "0.05"]


def tagged_agent(state_dir: Path, gpu: int = 0, extra_args: Iterable[str] = FAST) -> AgentProcess:
    """An agent (not started) whose every descendant can be found by its tag (`agent.tag`)."""
    tag = uuid.uuid4().hex
    proc = AgentProcess(state_dir=state_dir, gpu=gpu, extra_args=extra_args, env={**os.environ, TAG: tag})
    proc.tag = tag  # type: ignore[attr-defined]
    return proc


def tagged(tag: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Live processes (zombies count as dead) started under an agent with this tag."""
    skip = set(exclude)
    found = []
    for p in psutil.process_iter():
        if p.pid in skip:
            continue
        try:
            if p.environ().get(TAG) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Block until every pid has exited (via pidfds: an event per process, no polling); the ones left."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout_s
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def assert_all_reaped(tag: str, timeout_s: float = 10.0, exclude: Iterable[int] = ()) -> None:
    """No process started under the tagged agent outlives it (or, with `exclude`, outlives its worker)."""
    left = wait_gone([p.pid for p in tagged(tag, exclude)], timeout_s)
    still = [p for p in tagged(tag, exclude) if p.pid in left]
    assert not still, "orphans: " + "; ".join(f"{p.pid} {' '.join(p.cmdline())}" for p in still)


def assert_no_tracebacks(agent: AgentProcess) -> None:
    """The agent handled every fault: nothing escaped into a traceback in its log."""
    text = agent.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 300:][:3000]


class Ledger:
    """Snapshots of the harvested totals (per GPU and per task); every snapshot must be >= the last."""

    def __init__(self) -> None:
        self.gpu_s: list[float] = []
        self.tasks_s: dict[str, list[float]] = {}

    def sample(self, client: AgentClient) -> tasks_pb2.StatsResponse:
        stats = client.stats()
        self.gpu_s.append(stats.gpu.harvested_s)
        for t in stats.tasks:
            self.tasks_s.setdefault(t.id, []).append(t.counters.harvested_s)
        self.check()
        return stats

    def check(self) -> None:
        assert self.gpu_s == sorted(self.gpu_s), f"GPU harvest went backwards: {self.gpu_s}"
        for task_id, seen in self.tasks_s.items():
            assert seen == sorted(seen), f"task {task_id} harvest went backwards: {seen}"

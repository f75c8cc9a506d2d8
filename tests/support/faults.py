"""What every fault-injection case needs: tagged agents, a reaping check, and a ledger that must not shrink.

Every process an agent starts (workers, and whatever a task forks, however it detaches) inherits
the agent's environment. Each agent here gets a unique FREERIDE_FAULT_TAG, so "every process was
reaped" is checked without knowing any pid in advance: no live process may carry the tag.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

from freeride.agent.domain.model import Counters
from freeride.agent.state.registry import Registry
from freeride.client import AgentClient
from freeride.tooling.bench.pipeline import PipelineConfig, launch
from freeride.tooling.harness import AgentProcess
from freeride.v1 import tasks_pb2
from support.agents import FAST, wait_gone

TAG = "FREERIDE_FAULT_TAG"
TASKS = Path(__file__).parents[1] / "tasks"
PIPELINE = PipelineConfig(schedule="1F1B", stages=2, microbatches=4, forward_ms=5.0, backward_ms=10.0, iterations=24)


def ref(module: str, name: str) -> str:
    """A task class in tests/tasks/<module>.py, by file reference."""
    return f"{TASKS / module}.py:{name}"


class TaggedAgent(AgentProcess):
    """An agent whose every descendant can be found by its tag."""

    def __init__(self, state_dir: Path, gpu: int = 0, extra_args: Iterable[str] = FAST) -> None:
        self.tag = uuid.uuid4().hex
        super().__init__(state_dir=state_dir, gpu=gpu, extra_args=extra_args, env={**os.environ, TAG: self.tag})


def tagged_agent(state_dir: Path, gpu: int = 0, extra_args: Iterable[str] = FAST) -> TaggedAgent:
    """An agent (not started) with a tag of its own."""
    return TaggedAgent(state_dir, gpu, extra_args)


@contextlib.contextmanager
def clean_agent(state_dir: Path, extra_args: Iterable[str] = FAST) -> Iterator[TaggedAgent]:
    """A started agent that, when the block ends, must stop with code 0 and leave no process and no
    traceback behind."""
    proc = tagged_agent(state_dir, extra_args=extra_args).start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()
        assert_all_reaped(proc.tag)
        assert_no_tracebacks(proc)


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


def assert_all_reaped(tag: str, timeout_s: float = 30.0, exclude: Iterable[int] = ()) -> None:
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


class BeaconReader:
    """The reading end of a Beacon task's FIFO (tests/tasks/faulty.py): step end times, as events."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # so the reader never sees end-of-file
        self._buf = b""

    def _read(self) -> list[int]:
        with contextlib.suppress(BlockingIOError):
            self._buf += os.read(self._r, 1 << 16)
        n = len(self._buf) // 8
        stamps = list(struct.unpack(f"<{n}q", self._buf[: 8 * n]))
        self._buf = self._buf[8 * n:]
        return stamps

    def next_step(self, timeout_s: float) -> int:
        """Discard what was written so far, then block until the next step ends; its end time (ns)."""
        self._read()
        ready, _, _ = select.select([self._r], [], [], timeout_s)
        stamps = self._read() if ready else []
        assert stamps, f"no side-task step within {timeout_s}s"
        return stamps[-1]

    def until_quiet(self, quiet_s: float, limit_s: float = 30.0) -> list[int]:
        """Every step end until no step ended for `quiet_s` (the steps stopped)."""
        stamps: list[int] = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._r], [], [], quiet_s)
            if not ready:
                return stamps
            stamps += self._read()
        raise AssertionError(f"steps did not stop within {limit_s}s")

    def close(self) -> None:
        os.close(self._r)
        os.close(self._keep)


def durable(state_dir: Path) -> tuple[Counters, dict[str, float]]:
    """What the state database holds: the GPU's ledger and each task's harvested seconds."""
    reg = Registry(state_dir / "freeride.db")
    try:
        return reg.load_ledger(0), {r.id: r.counters.harvested_ns / 1e9 for r in reg.load()}
    finally:
        reg.close()


@functools.cache
def plain_run(out_dir: Path, config: PipelineConfig = PIPELINE) -> list[dict[str, Any]]:
    """A training run without freeride (once per session): what every faulty run must reproduce bit for bit."""
    return launch(config, out_dir)


def node_agents(root: Path, ranks: int = 2, extra_args: Iterable[str] = FAST) -> list[TaggedAgent]:
    """Tagged agents (not started), one per rank, sockets side by side in `root` where ranks look them up."""
    return [tagged_agent(root / f"state{r}", gpu=r, extra_args=extra_args)
            for r in range(ranks)]  # socket: root/agent-gpuR.sock


class Training:
    """The pipeline, instrumented, training in the background against the agents in `socket_dir`."""

    def __init__(self, socket_dir: Path, out_dir: Path, config: PipelineConfig = PIPELINE) -> None:
        cfg = PipelineConfig(**{**config.__dict__, "instrument": True, "socket_dir": str(socket_dir)})
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=lambda: self._out.update(results=launch(cfg, out_dir)), daemon=True)
        self._thread.start()

    def results(self, timeout_s: float = 180.0) -> list[dict[str, Any]]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "training did not finish"
        assert "results" in self._out, "training failed (see the rank logs)"
        return list(self._out["results"])


def assert_same_training(alone: list[dict[str, Any]], beside_faults: list[dict[str, Any]]) -> None:
    """Every rank computed bit for bit what it computes without freeride."""
    for a, b in zip(alone, beside_faults, strict=True):
        assert a["params_sha256"] == b["params_sha256"]
        assert a["losses"] == b["losses"]
    assert alone[-1]["losses"]

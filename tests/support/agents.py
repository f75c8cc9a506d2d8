"""Agents and synthetic trainers for the tests: a real agent's flags for fast failure paths, task references into
tests/tasks/behaviours.py, a rank that reports a trace's bubbles, one agent per rank, waiting for processes to go."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from freeride.core.pids import wait_pids
from freeride.tooling.harness import AgentProcess, WindowCollector, replay, wait_for_task
from freeride.tooling.trace import Segment
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

TASKS = Path(__file__).resolve().parents[1] / "tasks" / "behaviours.py"


FAST = ["--restart-backoff-s", "0.05", "--hang-timeout-s", "1", "--checkpoint-interval-s", "0.05"]


def task_ref(name: str) -> str:
    return f"{TASKS}:{name}"


def spec(name: str, **args: object) -> tasks_pb2.TaskSpec:
    return tasks_pb2.TaskSpec(ref=task_ref(name), args={k: str(v) for k, v in args.items()})


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bubbles(iterations: int, bubble_ms: list[float], compute_ms: float = 2.0) -> list[list[Segment]]:
    """A simple stage trace: per iteration, compute then each bubble (slots 0..n-1)."""
    it = []
    for slot, length in enumerate(bubble_ms):
        it += [Segment(compute_ms / 1e3, False), Segment(length / 1e3, True, slot)]
    return [list(it) for _ in range(iterations)]


def drive(agent: AgentProcess, trace: list[list[Segment]], rank: int = 0) -> list[tuple[int, int, int]]:
    """Report the trace's bubbles in real time from a synthetic trainer rank."""
    reporter = BubbleReporter(agent.target, rank=rank)
    try:
        assert reporter.wait_connected(10), "reporter did not connect"
        return replay(reporter, trace)
    finally:
        reporter.close()


def drive_until_a_step_ran(agent: AgentProcess, client: Any, tries: int = 10) -> None:
    """`drive` four iterations of one 20 ms bubble, again while no side-task step has run (harvested nothing): their
    two windows (after a skipped and a learned bubble) may both come before a worker's first steps fit them on a
    loaded machine. Each trainer stream has ended when it returns; AssertionError after `tries`."""
    for _ in range(tries):
        drive(agent, bubbles(4, [20.0]))
        if client.stats().gpu.harvested_s > 0:
            return
    raise AssertionError(f"no side-task step ran in {tries} x 4 bubbles of 20 ms")


def granted_windows(trace: list[list[Segment]]) -> int:
    """Windows the agent grants: none in the first two iterations (one skipped, one learned)."""
    return sum(seg.bubble for it in trace[2:] for seg in it)


class BackgroundTrainer:
    """A synthetic trainer rank reporting the same iteration over and over until stopped.

    `free_bytes` is the free-memory hint each bubble START carries (0: none); a test may change it as it goes.
    """

    def __init__(self, agent: AgentProcess, bubble_ms: list[float], compute_ms: float = 2.0, rank: int = 0,
                 free_bytes: int = 0) -> None:
        self.free_bytes = free_bytes
        self._iteration = bubbles(1, bubble_ms, compute_ms)
        self._reporter = BubbleReporter(agent.target, rank=rank)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ran = threading.Condition()
        self.iterations = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            replay(self._reporter, self._iteration, lambda: self.free_bytes)
            with self._ran:
                self.iterations += 1
                self._ran.notify_all()

    def wait_iterations(self, more: int, timeout_s: float = 30.0) -> bool:
        """Block until `more` iterations past this call were reported (bubbles go on, whether or not the agent,
        quiet while no task could take a window, grants any)."""
        with self._ran:
            target = self.iterations + more
            return self._ran.wait_for(lambda: self.iterations >= target, timeout_s)

    def __enter__(self) -> BackgroundTrainer:
        assert self._reporter.wait_connected(10), "reporter did not connect"
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._reporter.close()


class Agents:
    """One agent per rank, sockets side by side as a node's runtime directory would hold them."""

    def __init__(self, root: Path, ranks: int = 4) -> None:
        self.socket_dir = root
        self.procs = [AgentProcess(state_dir=root / f"state{r}", gpu=r) for r in range(ranks)]
        self.clients: list[Any] = []
        self.collectors: list[WindowCollector] = []

    def start(self) -> Agents:
        """Every agent up side by side, then each given its task; back once every task is READY (the agents' imports,
        checks and workers overlap: one at a time, four took 4.6 s on the 2-core VM)."""
        try:
            for proc in self.procs:
                proc.spawn()
            for proc in self.procs:
                proc.wait_ready()
                self.clients.append(proc.client())
            tasks = [c.submit(tasks_pb2.TaskSpec(ref="freeride.tooling.tasks:SleepTask", args={"step_ms": "1"}))
                     for c in self.clients]
            for client, task in zip(self.clients, tasks, strict=True):
                wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])
                self.collectors.append(WindowCollector(client))
        except BaseException:
            self.stop()  # none left running for a start that failed half-way
            raise
        return self

    def stop(self) -> None:
        for c in self.collectors:
            c.close()
        for c in self.clients:
            c.close()
        for proc in self.procs:
            proc.stop()


    def launch(self, argv: Callable[[int], list[str]], out_dir: Path, **env: str) -> list[str]:
        """Run one rank program per agent (torchrun's environment on a free port, the agents' socket directory),
        each rank's output in out_dir/rankN.log; wait for all, kill what is left, and return the logs, every rank
        having exited 0 (else the assertion shows them)."""
        from freeride.tooling.bench.pipeline import free_port

        port, ranks = free_port(), len(self.procs)
        procs = []
        for rank in range(ranks):
            rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                            WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                            FREERIDE_SOCKET_DIR=str(self.socket_dir), **env)
            log = open(out_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(argv(rank), env=rank_env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL), log))
        try:
            for proc, _ in procs:
                proc.wait(240)
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
        logs = [(out_dir / f"rank{r}.log").read_text(errors="replace") for r in range(ranks)]
        assert all(p.returncode == 0 for p, _ in procs), logs
        return logs


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Block until every pid has exited (via pidfds: an event per process, no polling); the ones left."""
    return wait_pids(pids, timeout_s)

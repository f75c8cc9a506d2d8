"""One pool drained by several agents, as a node would run it: for `freeride bench pool` and the pool fault tests.

The pool's items are FilePool items (item i writes `out/i`, poison items raise); each agent gets its
own fake GPU index and a synthetic trainer rank (a thread replaying one bubble per period, the
ranks' phases spread over the period), and runs FilePool. Every wait is on events: an agent's
event stream (its windows, its tasks' changes), never a fixed sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from freeride.client import AgentClient
from freeride.pool import Pool, PoolItem, PoolStatus, parse_pool_url
from freeride.pool.driver import redis_py
from freeride.tooling.harness import (
    AgentProcess,
    replay,
    wait_for_any,
    wait_for_info,
    wait_for_task,
    wait_for_trainers,
)
from freeride.tooling.trace import Segment
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

FILE_POOL = "freeride.tooling.tasks:FilePool"
FAKE_GPU = ("--fake-gpu",)
_ENDED = (tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED, tasks_pb2.TASK_STATE_CANCELLED)
_UP = (tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_RUNNING)  # RUNNING: READY and holding a window now


def worker_up(info: tasks_pb2.TaskInfo) -> bool:
    """The task has a worker that is ready for windows (or holds one)."""
    return info.state in _UP and info.pid != 0

AgentFactory = Callable[[Path, int], AgentProcess]  # (state dir, GPU index) -> an agent, not started


def file_pool_items(count: int, poison: Iterable[int] = ()) -> list[PoolItem]:
    """Items "0" … "count-1"; those in `poison` carry {"poison": true} (FilePool raises on them)."""
    bad = set(poison)
    return [PoolItem(str(i), {"poison": True} if i in bad else {}) for i in range(count)]


class BubbleLoop:
    """A synthetic trainer rank: `period_ms - bubble_ms` of compute, then a bubble, until closed.

    `phase_ms` of compute come first, so several ranks' bubbles do not all start at once. The
    reporter reconnects within half a second to an agent that was killed and started again.
    """

    def __init__(self, target: str, bubble_ms: float, period_ms: float, phase_ms: float = 0.0) -> None:
        if not 0 < bubble_ms < period_ms:
            raise ValueError(f"need 0 < bubble_ms < period_ms, got {bubble_ms} and {period_ms}")
        compute_s = (period_ms - bubble_ms) / 1e3
        self._first = [[Segment(phase_ms / 1e3 + compute_s, False), Segment(bubble_ms / 1e3, True, 0)]]
        self._chunk = [[Segment(compute_s, False), Segment(bubble_ms / 1e3, True, 0)]] * 10
        self.reporter = BubbleReporter(target, rank=0, reconnect_max_s=0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"bubbles {target}")
        self._ran = threading.Condition()
        self.bubbles = 0  # reported so far

    def _run(self) -> None:
        replay(self.reporter, self._first)
        self._count(len(self._first))
        while not self._stop.is_set():
            replay(self.reporter, self._chunk)
            self._count(len(self._chunk))

    def _count(self, bubbles: int) -> None:
        with self._ran:
            self.bubbles += bubbles
            self._ran.notify_all()

    def wait_bubbles(self, more: int, timeout_s: float = 30.0) -> bool:
        """Block until `more` bubbles past this call were reported (whether or not the agent, quiet while no task
        could take a window, grants any)."""
        with self._ran:
            target = self.bubbles + more
            return self._ran.wait_for(lambda: self.bubbles >= target, timeout_s)

    def start(self, timeout_s: float = 10.0) -> BubbleLoop:
        if not self.reporter.wait_connected(timeout_s):
            raise TimeoutError(f"the synthetic trainer did not connect to {self.reporter.target} in {timeout_s}s")
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.reporter.close()


class PoolRun:
    """`agents` agents (state in root/stateK, GPU K) draining the pool at `url` with FilePool into root/out
    (or with the pool task `task_ref` and its `task_args`, beside `pool`).

    `make_agent(state_dir, gpu)` builds each agent (and the one that replaces a killed one); by
    default a plain AgentProcess on a fake GPU with `agent_args`. Use as a context manager: closing
    stops the synthetic trainers, then every agent still running (their exit codes in `exit_codes`).
    """

    def __init__(self, root: Path, url: str, agents: int, *, work_us: float = 0.0, cpu: bool = True,
                 max_step_ms: float = 0.0, bubble_ms: float = 20.0, period_ms: float = 30.0,
                 agent_args: Sequence[str] = FAKE_GPU, make_agent: AgentFactory | None = None,
                 task_ref: str = FILE_POOL, task_args: Mapping[str, str] | None = None) -> None:
        if agents < 1:
            raise ValueError(f"need at least one agent, got {agents}")
        self.root = root
        self.url = url
        self.out_dir = root / "out"
        self.work_us = work_us
        self.cpu = cpu  # FilePool's work: CPU (busy loop), or sleep (a GPU kernel's wait)
        self.max_step_ms = max_step_ms  # FilePool's longest planned step (0: PoolTask's default)
        self.bubble_ms, self.period_ms = bubble_ms, period_ms
        self._make = make_agent or (lambda state_dir, gpu: AgentProcess(state_dir=state_dir, gpu=gpu,
                                                                        extra_args=agent_args))
        self.agents: list[AgentProcess] = [self._make(root / f"state{k}", k) for k in range(agents)]
        self.alive: set[int] = set()
        self.task_ids: list[str] = []
        self.exit_codes: dict[int, int] = {}
        pool_url = parse_pool_url(url)
        # One retry on a broken connection: the run's own view of the pool outlives a restart of Redis.
        redis = redis_py()  # (the pool extra: PoolError without it)
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.pool = Pool(pool_url, client=redis.Redis.from_url(pool_url.redis_url, socket_timeout=10.0,
                                                                 retry=Retry(NoBackoff(), 1)))
        self._loops: list[BubbleLoop | None] = [None] * agents
        self.task_ref = task_ref
        self.task_args = dict(task_args) if task_args is not None else {
            "out_dir": str(self.out_dir), "work_us": repr(float(self.work_us)),
            "max_step_ms": repr(float(self.max_step_ms)), "cpu": str(self.cpu)}

    # -- set-up ----------------------------------------------------------------------------------------------------
    def create(self, items: int, poison: Iterable[int] = (), lease_s: float = 30.0, max_tries: int = 3) -> int:
        return self.pool.create(file_pool_items(items, poison), lease_s=lease_s, max_tries=max_tries)

    def start(self, timeout_s: float = 60.0) -> None:
        """Start every agent (side by side), submit the pool task to each, wait until every worker is ready,
        then start the synthetic trainers (their phases spread over the period): items move from then on."""
        for agent in self.agents:
            agent.spawn()
        for k, agent in enumerate(self.agents):
            agent.wait_ready(timeout_s)
            self.alive.add(k)
        spec = tasks_pb2.TaskSpec(name="pool-task", ref=self.task_ref, args={"pool": self.url, **self.task_args})
        for agent in self.agents:
            with agent.client() as c:
                self.task_ids.append(c.submit(spec).id)
        for k in range(len(self.agents)):
            self.wait_task(k, worker_up, timeout_s)
        for k in range(len(self.agents)):
            self._start_loop(k)

    def _start_loop(self, k: int) -> None:
        phase_ms = self.period_ms * k / len(self.agents)
        self._loops[k] = BubbleLoop(self.agents[k].target, self.bubble_ms, self.period_ms, phase_ms).start()

    # -- faults ----------------------------------------------------------------------------------------------------
    def kill9(self, k: int) -> None:
        """SIGKILL agent k (its workers notice and stop on their own); its trainer goes on reporting into the void."""
        self.agents[k].kill9()
        self.alive.discard(k)

    def restart(self, k: int, timeout_s: float = 60.0) -> AgentProcess:
        """A new agent on agent k's state dir and GPU (killed before): its task comes back from the store,
        with a new worker, and its trainer reconnects."""
        agent = self._make(self.agents[k].state_dir, self.agents[k].gpu)
        self.agents[k] = agent.start(timeout_s)
        self.alive.add(k)
        with agent.client() as c:
            wait_for_trainers(c, 1, timeout_s)
        self.wait_task(k, worker_up, timeout_s)
        return agent

    # -- waits -----------------------------------------------------------------------------------------------------
    def wait_bubbles(self, k: int, more: int, timeout_s: float = 30.0) -> bool:
        """Block until agent k's synthetic trainer reported `more` bubbles past this call."""
        loop = self._loops[k]
        return loop is not None and loop.wait_bubbles(more, timeout_s)

    def client(self, k: int) -> AgentClient:
        return self.agents[k].client()

    def wait_task(self, k: int, ok: Callable[[tasks_pb2.TaskInfo], bool], timeout_s: float = 30.0,
                  ) -> tasks_pb2.TaskInfo:
        """Block until agent k's FilePool task satisfies `ok` (its state, reason, pid, restarts)."""
        with self.client(k) as c:
            return wait_for_info(c, self.task_ids[k], ok, timeout_s)

    def wait_pool(self, ok: Callable[[PoolStatus], bool], timeout_s: float, watch: int | None = None) -> PoolStatus:
        """Block until the pool's status satisfies `ok`, asked again at each window or task change any agent alive
        accounts (only agent `watch`'s, if given): items move only in windows, and the agents other than the first
        may take every item while the first waits for one."""
        ks = sorted(self.alive) if watch is None else [watch]

        def check() -> PoolStatus | None:
            status = self.pool.status(dead_shown=0)
            return status if ok(status) else None

        clients = [self.client(k) for k in ks]
        try:
            found = wait_for_any(clients, check,
                                 lambda ev: check() if ev.HasField("window") or ev.HasField("task") else None,
                                 timeout_s)
        finally:
            for c in clients:
                c.close()
        if found is None:
            s = self.pool.status(dead_shown=0)
            raise TimeoutError(f"the pool did not get there in {timeout_s}s: total {s.total}, done {s.done}, failed "
                               f"{s.failed}, in flight {s.in_flight}, queued {s.queued}")
        return found

    def wait_finished(self, timeout_s: float) -> dict[int, tasks_pb2.TaskInfo]:
        """Block until every live agent's task has ended (DONE when the pool is finished); their infos."""
        deadline = time.monotonic() + timeout_s
        infos = {}
        for k in sorted(self.alive):
            with self.client(k) as c:
                infos[k] = wait_for_task(c, self.task_ids[k], _ENDED, max(1.0, deadline - time.monotonic()))
        return infos

    # -- results ---------------------------------------------------------------------------------------------------
    def agent_stats(self) -> dict[int, tasks_pb2.StatsResponse]:
        out = {}
        for k in sorted(self.alive):
            with self.client(k) as c:
                out[k] = c.stats()
        return out

    def outputs(self) -> dict[str, str]:
        """Every output file (not the journals, not a killed writer's temporary file): id -> content."""
        return {p.name: p.read_text() for p in self.out_dir.iterdir() if not p.name.startswith(".")}

    def journal(self) -> dict[str, int]:
        """How many times each id was passed to process(), over every consumer's journal."""
        counts: dict[str, int] = {}
        for path in self.out_dir.glob(".processed-*"):
            for line in path.read_text().splitlines():
                counts[line] = counts.get(line, 0) + 1
        return counts

    # -- tear-down -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        for loop in self._loops:
            if loop is not None:
                loop.close()
        for k, agent in enumerate(self.agents):  # those killed have exited; one that never came up is stopped too
            code = agent.stop()
            if k in self.alive:
                self.exit_codes[k] = code
        self.alive.clear()
        self.pool.close()

    def __enter__(self) -> PoolRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""Run a real agent as a child process and wait on it by events: used by the demo, benchmarks and tests."""

from __future__ import annotations

import itertools
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from freeride.client import AgentClient
from freeride.core.stats import percentile
from freeride.errors import AgentNotReadyError, AgentUnavailableError, FreerideError
from freeride.tooling.trace import Segment
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import tasks_pb2

T = TypeVar("T")
# How long a wait for something an agent does may last before it is a failure. An event ends every wait at once, so
# this costs nothing where things go right; it is generous for a machine loaded at twice its cores, where starting
# a worker (an interpreter, freeride, the task's imports) took over 30 s.
WAIT_S = 60.0


class AgentProcess:
    """`freeride agent` in a child process with its own state dir and socket."""

    def __init__(self, state_dir: Path | None = None, gpu: int = 0, extra_args: Iterable[str] = (),
                 log_path: Path | None = None, env: Mapping[str, str] | None = None,
                 new_session: bool = False) -> None:
        self._tmp = None if state_dir is not None else tempfile.TemporaryDirectory(prefix="freeride-")
        self.state_dir = state_dir if state_dir is not None else Path(self._tmp.name) / "state"  # type: ignore[union-attr]
        self.socket = self.state_dir.parent / f"agent-gpu{gpu}.sock"
        self.gpu = gpu
        self.target = f"unix:{self.socket}"
        self._extra = list(extra_args)
        self.log_path = log_path or self.state_dir.parent / f"agent-gpu{gpu}.log"
        self._env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._new_session = new_session  # True: a terminal's Ctrl-C reaches the parent only, which stops it in order

    def start(self, timeout_s: float = WAIT_S) -> AgentProcess:
        return self.spawn().wait_ready(timeout_s)

    def spawn(self) -> AgentProcess:
        """Start the process without waiting for it (several agents can then come up side by side)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "freeride", "agent", "--gpu", str(self.gpu), "--state-dir", str(self.state_dir),
                 "--socket", str(self.socket), *self._extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env,
                start_new_session=self._new_session,
            )
        return self

    def wait_ready(self, timeout_s: float = WAIT_S) -> AgentProcess:
        assert self.proc is not None, "spawn() first"
        with AgentClient(self.target) as c:
            try:
                c.wait_ready(timeout_s)
            except AgentUnavailableError:
                code = self.proc.poll()
                raise AgentNotReadyError(
                    f"agent did not come up (exit code {code}); log: {self.log_path}\n{self.log_tail()}"
                ) from None
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the ordered shutdown; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self) -> AgentClient:
        return AgentClient(self.target)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


def wait_for(
    client: AgentClient, now: Callable[[], T | None], on_event: Callable[[tasks_pb2.AgentEvent], T | None],
    timeout_s: float = WAIT_S,
) -> T | None:
    """The first non-None of `now()` (asked once subscribed, so nothing slips between) and `on_event`
    over the agent's event stream; None after `timeout_s`. Every wait in the tests is one of these."""
    events = client.watch()
    timer = threading.Timer(timeout_s, events.cancel)
    timer.start()
    try:
        found = now()
        if found is not None:
            return found
        for ev in events:
            found = on_event(ev)
            if found is not None:
                return found
    finally:
        timer.cancel()
        events.cancel()
    return None


def wait_for_any(
    clients: Sequence[AgentClient], now: Callable[[], T | None],
    on_event: Callable[[tasks_pb2.AgentEvent], T | None], timeout_s: float = WAIT_S,
) -> T | None:
    """`wait_for` over several agents' event streams at once: `now()` once every stream is subscribed, then
    `on_event` for each event of any of them, as it comes (a reader thread per stream hands them over)."""
    streams = [c.watch() for c in clients]
    arrived: queue.SimpleQueue[tasks_pb2.AgentEvent | None] = queue.SimpleQueue()

    def read(events: Any) -> None:
        for ev in events:
            arrived.put(ev)
        arrived.put(None)  # this stream ended (cancelled, or its agent gone)

    readers = [threading.Thread(target=read, args=(events,), daemon=True) for events in streams]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout_s
    open_streams = len(streams)
    try:
        found = now()
        while found is None and open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                ev = arrived.get(timeout=left)
            except queue.Empty:
                break
            if ev is None:
                open_streams -= 1
                continue
            found = on_event(ev)
        return found
    finally:
        for events in streams:
            events.cancel()
        for t in readers:
            t.join(5)


def wait_for_info(
    client: AgentClient, task_id: str, ok: Callable[[tasks_pb2.TaskInfo], bool], timeout_s: float = WAIT_S,
    at_windows: bool = False,
) -> tasks_pb2.TaskInfo:
    """Block until the task's info satisfies `ok` (a state, a reason, a restart count, ...). `at_windows`: read it
    again at each window the agent accounts too, for what changes there with no task event (counters, progress)."""

    def now() -> tasks_pb2.TaskInfo | None:
        info = client.get(task_id)
        return info if ok(info) else None

    def on_event(ev: tasks_pb2.AgentEvent) -> tasks_pb2.TaskInfo | None:
        if at_windows and ev.HasField("window"):
            return now()
        return ev.task if ev.HasField("task") and ev.task.id == task_id and ok(ev.task) else None

    found = wait_for(client, now, on_event, timeout_s)
    if found is None:
        info = client.get(task_id)
        raise TimeoutError(f"task {task_id} did not get there in {timeout_s}s: "
                           f"{tasks_pb2.TaskState.Name(info.state)} {info.reason}")
    return found


def wait_for_task(
    client: AgentClient, task_id: str, states: Iterable[int], timeout_s: float = WAIT_S
) -> tasks_pb2.TaskInfo:
    """Block until the task reaches one of `states`, driven by the agent's event stream."""
    wanted = set(states)
    try:
        return wait_for_info(client, task_id, lambda t: t.state in wanted, timeout_s)
    except TimeoutError:
        names = [tasks_pb2.TaskState.Name(s) for s in wanted]
        info = client.get(task_id)
        raise TimeoutError(f"task {task_id} did not reach {names} in {timeout_s}s: "
                           f"{tasks_pb2.TaskState.Name(info.state)} {info.reason}") from None


def wait_for_trainers(client: AgentClient, count: int, timeout_s: float = WAIT_S) -> tasks_pb2.StatsResponse:
    """Block until exactly `count` trainer streams are open (the agent announces each change)."""

    def now() -> tasks_pb2.StatsResponse | None:
        stats = client.stats()
        return stats if stats.gpu.trainers == count else None

    def on_event(ev: tasks_pb2.AgentEvent) -> tasks_pb2.StatsResponse | None:
        return client.stats() if ev.HasField("trainer") and ev.trainer.trainers == count else None

    found = wait_for(client, now, on_event, timeout_s)
    if found is None:
        raise TimeoutError(f"{client.stats().gpu.trainers} trainer streams open after {timeout_s}s, not {count}")
    return found


class WindowCollector:
    """Gathers the agent's accounted windows from its event stream, in the background."""

    def __init__(self, client: AgentClient) -> None:
        self.windows: list[tasks_pb2.WindowRecord] = []
        self._cond = threading.Condition()
        self._events = client.watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._events:
                if ev.HasField("window"):
                    with self._cond:
                        self.windows.append(ev.window)
                        self._cond.notify_all()
        except FreerideError:
            pass  # the agent went away (close() ends the stream quietly)

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Block until at least `count` windows were accounted; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.windows) >= count, timeout_s)

    def wait_for_all(self, client: AgentClient, timeout_s: float = WAIT_S) -> int:
        """Once every trainer stream has ended, block until every window the agent granted is
        accounted; the count. A busy machine may make the agent skip a bubble (a late edge, a
        widened margin), so the count comes from the agent, not from the trace. A window is accounted when its
        worker says it is done with it, and workers run at nice 19 against every other session (fix 59): on a
        loaded runner that can take seconds, hence the generous ceiling (an event ends the wait at once)."""
        wait_for_trainers(client, 0, timeout_s)
        granted = client.stats().gpu.windows_granted
        if not self.wait_for(granted, timeout_s):
            raise TimeoutError(f"{len(self.windows)} of {granted} granted windows accounted after {timeout_s}s")
        return granted

    def wait_until(self, predicate: Callable[[list[tasks_pb2.WindowRecord]], bool], timeout_s: float) -> bool:
        """Block until `predicate(windows)` holds; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.windows), timeout_s)

    def close(self) -> None:
        self._events.cancel()
        self._thread.join(timeout=5)

    def __enter__(self) -> WindowCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def grant_latencies_us(windows: Iterable[tasks_pb2.WindowRecord]) -> list[float]:
    """START stamped by the trainer -> the first side-task step began, for each window that ran one."""
    return [(w.shares[0].first_step_ns - w.bubble_start_ns) / 1e3 for w in windows if w.shares and w.shares[0].steps]


# A grant's four legs, each from one process's CLOCK_MONOTONIC stamp to the next (one clock on one host).
GRANT_PARTS = ("trainer_to_agent", "agent", "agent_to_worker", "worker")


def grant_parts_us(windows: Iterable[tasks_pb2.WindowRecord]) -> dict[str, list[float]]:
    """Where each grant's time went: START stamped -> the agent took it -> wrote the grant -> the worker saw
    it -> its first step began; for the windows whose first share ran a step and has every stamp."""
    parts: dict[str, list[float]] = {name: [] for name in GRANT_PARTS}
    for w in windows:
        s = w.shares[0] if w.shares else None
        if s is None or not s.steps or not (w.seen_ns and s.granted_ns and s.woke_ns):
            continue
        stamps = (w.bubble_start_ns, w.seen_ns, s.granted_ns, s.woke_ns, s.first_step_ns)
        for name, (a, b) in zip(GRANT_PARTS, itertools.pairwise(stamps), strict=True):
            parts[name].append((b - a) / 1e3)
    return parts


def grant_parts_summary(windows: Iterable[tasks_pb2.WindowRecord]) -> dict[str, float]:
    """p50 and p99 of each leg, as flat JSON keys: grant_agent_us_p50, ..."""
    out: dict[str, float] = {}
    for name, values in grant_parts_us(windows).items():
        out[f"grant_{name}_us_p50"] = round(percentile(values, 0.5), 1)
        out[f"grant_{name}_us_p99"] = round(percentile(values, 0.99), 1)
    return out


def sleep_until(deadline_ns: int) -> None:
    """The synthetic trainer's stand-in for compute and for waiting on a neighbour."""
    delay = deadline_ns - time.monotonic_ns()
    if delay > 0:
        time.sleep(delay / 1e9)


def replay(
    reporter: BubbleReporter, iterations: list[list[Segment]], free_memory_bytes: Callable[[], int] = lambda: 0
) -> list[tuple[int, int, int]]:
    """Play a stage's trace in real time; returns (slot, start_ns, end_ns) of every bubble reported.
    Each START carries `free_memory_bytes()` as the trainer's free-memory hint (0: none)."""
    bubbles = []
    t = time.monotonic_ns()
    for it, segments in enumerate(iterations):
        reporter.set_iteration(it)
        for seg in segments:
            t += int(seg.duration_s * 1e9)
            if seg.bubble:
                reporter.start(seg.slot, seg.kind, free_memory_bytes=free_memory_bytes())
                start = time.monotonic_ns()
                sleep_until(t)
                end = time.monotonic_ns()
                reporter.end(seg.slot, seg.kind)
                bubbles.append((seg.slot, start, end))
            else:
                sleep_until(t)
    return bubbles

"""A worker's other threads between windows: SCHED_IDLE while its gate waits holding no window, their policy back
when a window is granted or a stop begins; the CPU they used meanwhile, reported once (freeride.worker.offwindow).

Driven through the real step gate and window word (no agent): the thread that calls acquire() stands for the
worker's main thread; the task's threads are real threads, read back with os.sched_getscheduler on their ids.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride import TaskStop
from freeride.core.window import WindowReader, WindowWriter
from freeride.worker.estimate import StepEstimator
from freeride.worker.gate import Shared, StepGate
from freeride.worker.messages import Outbox
from freeride.worker.offwindow import PERIOD_S, OffWindow, may_leave_idle, threads
from freeride.worker.terms import Control

needs_idle = pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE") or bool(may_leave_idle(os.getpriority(os.PRIO_PROCESS, 0))),
    reason="needs Linux and the right to leave SCHED_IDLE (root, CAP_SYS_NICE or RLIMIT_NICE)")


class TaskThread:
    """A thread the task started: it blocks until told to end (its policy is what is looked at)."""

    def __init__(self) -> None:
        self._end = threading.Event()
        started = threading.Event()
        self.tid = 0

        def run() -> None:
            self.tid = threading.get_native_id()
            started.set()
            self._end.wait()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        started.wait(5)

    def policy(self) -> int:
        return os.sched_getscheduler(self.tid)

    def end(self) -> None:
        self._end.set()
        self._thread.join(5)


@pytest.fixture
def task_thread() -> Iterator[TaskThread]:
    t = TaskThread()
    yield t
    t.end()


def gate_with(reports: list[tuple[int, int]], spare: frozenset[int]) -> tuple[StepGate, WindowWriter, Shared]:
    writer = WindowWriter()
    shared = Shared()
    gate = StepGate(shared, Outbox(lambda msg: None), StepEstimator(), lambda force: None)
    gate.window = WindowReader(*writer.child_fds())
    gate.off_window = OffWindow(True, lambda cpu, waited: reports.append((cpu, waited)), time.monotonic_ns,
                                spare=spare)
    return gate, writer, shared


def wait_for_policy(t: TaskThread, policy: int) -> bool:
    deadline = time.monotonic() + 5
    while t.policy() != policy and time.monotonic() < deadline:
        time.sleep(0.005)
    return t.policy() == policy


@needs_idle
def test_the_tasks_threads_idle_while_the_worker_waits_and_get_their_policy_back_with_the_window(
    task_thread: TaskThread,
) -> None:
    others = frozenset(threads()) - {task_thread.tid}  # pytest's own: not the worker's, left alone
    gate, writer, _ = gate_with([], others)
    nice = os.getpriority(os.PRIO_PROCESS, task_thread.tid)
    waiter = threading.Thread(target=gate.acquire, daemon=True)
    waiter.start()
    assert wait_for_policy(task_thread, os.SCHED_IDLE)
    assert waiter.native_id is not None and os.sched_getscheduler(waiter.native_id) == os.SCHED_OTHER  # it wakes
    writer.grant(1, time.monotonic_ns() + 10**9)
    waiter.join(5)
    assert not waiter.is_alive()
    # Back before acquire() returned: the window's first step runs with every thread at its policy.
    assert task_thread.policy() == os.SCHED_OTHER
    assert os.getpriority(os.PRIO_PROCESS, task_thread.tid) == nice


@needs_idle
def test_a_stop_gives_the_threads_their_policy_back_before_the_checkpoint(task_thread: TaskThread) -> None:
    gate, _, shared = gate_with([], frozenset(threads()) - {task_thread.tid})
    stopped: list[int] = []

    def acquire() -> None:
        try:
            gate.acquire()
        except TaskStop:
            stopped.append(task_thread.policy())  # what the checkpoint would run with

    waiter = threading.Thread(target=acquire, daemon=True)
    waiter.start()
    assert wait_for_policy(task_thread, os.SCHED_IDLE)
    shared.control = Control.PAUSE
    shared.wake()
    waiter.join(5)
    assert stopped == [os.SCHED_OTHER]


@needs_idle
def test_a_thread_the_task_itself_put_at_sched_idle_stays_there(task_thread: TaskThread) -> None:
    os.sched_setscheduler(task_thread.tid, os.SCHED_IDLE, os.sched_param(0))
    off = OffWindow(True, lambda cpu, waited: None, time.monotonic_ns,
                    spare=frozenset(threads()) - {task_thread.tid})
    off.enter()
    off.leave()
    off.restore()
    assert task_thread.policy() == os.SCHED_IDLE


class Clocks:
    def __init__(self) -> None:
        self.wall_ns = 1
        self.cpu_ns = 0

    def wait(self, wall_s: float, cpu_s: float, off: OffWindow) -> None:
        off.enter()
        self.wall_ns += int(wall_s * 1e9)
        self.cpu_ns += int(cpu_s * 1e9)
        off.leave()


def test_cpu_used_between_windows_is_reported_once_when_over_a_tenth_of_a_core(tmp_path: Path) -> None:
    clocks = Clocks()
    reports: list[tuple[int, int]] = []
    off = OffWindow(False, lambda cpu, waited: reports.append((cpu, waited)), lambda: clocks.wall_ns,
                    lambda: clocks.cpu_ns, tasks_dir=tmp_path)
    for _ in range(int(PERIOD_S / 0.1) * 3):  # short waits, as between bubbles: 5 % of a core, never reported
        clocks.wait(0.1, 0.005, off)
    assert reports == []
    for _ in range(int(PERIOD_S / 0.1)):  # a thread burning half a core: reported once the period is full
        clocks.wait(0.1, 0.05, off)
    assert len(reports) == 1 and reports[0][0] == pytest.approx(0.5 * reports[0][1], rel=0.05)
    for _ in range(int(PERIOD_S / 0.1) * 3):
        clocks.wait(0.1, 0.05, off)
    assert len(reports) == 1  # once per worker


def test_demoting_between_windows_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # gRPC starts I/O threads after the worker's own are counted: demoted, one delayed the message that ends a window
    # by seconds on a loaded runner. The session's autogroup nice does the job by default (fix 59).
    monkeypatch.delenv("FREERIDE_OFF_WINDOW_IDLE", raising=False)
    assert not OffWindow.for_placement(None, lambda cpu, waited: None, time.monotonic_ns)._demote
    monkeypatch.setenv("FREERIDE_OFF_WINDOW_IDLE", "1")
    assert OffWindow.for_placement(None, lambda cpu, waited: None, time.monotonic_ns)._demote == (
        may_leave_idle(os.getpriority(os.PRIO_PROCESS, 0)) == "")

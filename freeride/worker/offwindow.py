"""What a worker's threads may do while it holds no window, and what they did.

Between windows the worker's main thread blocks in the step gate's wait; anything else the task left
running (a prefetch thread, an OpenMP pool spinning, a thread that never stops) competes with training,
at nice 19 still for a slice of every core it lands on. `OffWindow` puts every other thread of the
worker at SCHED_IDLE when the wait begins (CPU time only on a core nothing else wants) and gives them
back their policy when a window is granted or before a checkpoint (a paused worker must get CPU to save
its state). The worker's own threads keep their policy throughout (`spare`: those running before the task's
code is loaded, the main thread, the gRPC threads that bring pause and cancel): the main thread wakes on the
grant at once and restores the others before the window's first step.

Leaving SCHED_IDLE needs root, CAP_SYS_NICE or an RLIMIT_NICE that allows the thread's niceness
(`LimitNICE=1` under systemd for nice 19); without it the threads stay at their niceness, as before
(`available()` says why). Only this process's threads: processes the task started are not demoted.

It also measures the CPU the process used during those waits (getrusage: every thread, not children)
and reports it once, through `report`, when that exceeded SHARE of a core over at least PERIOD_S of
waiting: the agent names the task. Judged when a wait ends; no timer of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path

from freeride.core.cpu import Placement

log = logging.getLogger("freeride.worker")

SHARE = 0.10  # of one core, while holding no window: above it the task is reported
PERIOD_S = 2.0  # of waiting, at least, before that share is judged (a checkpoint's tail, a GC, ...)


def cpu_ns() -> int:
    """CPU time of every thread of this process, user and system (not of its children)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


def may_leave_idle(nice: int) -> str:
    """"" when a thread of this process at `nice` may go SCHED_IDLE and come back, else why not. Tried on a
    throwaway thread (root, CAP_SYS_NICE, RLIMIT_NICE, a seccomp filter: all decide), after raising the
    soft RLIMIT_NICE to what `nice` needs where the hard limit allows."""
    need = 20 - nice
    soft, hard = resource.getrlimit(resource.RLIMIT_NICE)
    if soft < need and (hard == resource.RLIM_INFINITY or hard >= need):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NICE, (need, hard))
    problem: list[str] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            problem.append(f"leaving SCHED_IDLE is refused ({exc.strerror}): it needs root, CAP_SYS_NICE or "
                           f"RLIMIT_NICE >= {need} (systemd LimitNICE={need}, limits.conf nice)")

    thread = threading.Thread(target=probe, name="freeride-sched-probe")
    thread.start()
    thread.join()
    return problem[0] if problem else ""


def threads(tasks_dir: Path = Path("/proc/self/task")) -> list[int]:
    """The ids of this process's threads (none where /proc cannot be read)."""
    try:
        return [int(t.name) for t in tasks_dir.iterdir()]
    except OSError:
        return []


class OffWindow:
    """The worker's other threads at SCHED_IDLE while it waits holding no window; its CPU meanwhile, reported."""

    def __init__(self, demote: bool, report: Callable[[int, int], None],
                 clock_ns: Callable[[], int], cpu_clock_ns: Callable[[], int] = cpu_ns,
                 tasks_dir: Path = Path("/proc/self/task"), spare: frozenset[int] = frozenset()) -> None:
        """`demote`: whether to move threads at all (see `for_placement`); `report(cpu_ns, waited_ns)`: called
        once, the first time the share is exceeded; `spare`: thread ids never demoted (besides the caller's)."""
        self._demote = demote
        self._spare = spare
        self._report = report
        self._clock_ns = clock_ns
        self._cpu_ns = cpu_clock_ns
        self._tasks_dir = tasks_dir
        self._demoted: dict[int, int] = {}  # thread id -> the policy it had
        self._waited_ns = 0
        self._spent_ns = 0
        self._since = (0, 0)  # (wall, cpu) when the wait under way began; (0, 0): none
        self.reported = False

    @classmethod
    def for_placement(cls, placement: Placement | None, report: Callable[[int, int], None],
                      clock_ns: Callable[[], int]) -> OffWindow:
        """Demoting where it can be undone and would change something: not for a worker placed at SCHED_IDLE
        already, nor where SCHED_IDLE cannot be left (said once in the task's log), nor on a host without it."""
        # Opt-in (FREERIDE_OFF_WINDOW_IDLE=1 in the agent's environment, which workers inherit): gRPC starts I/O
        # threads after the worker's own were counted, and one demoted between windows delayed the message that
        # ends a window for seconds on a loaded 2-core runner (a priority inversion). The session's autogroup nice
        # (freeride.core.cpu.lower_autogroup) already keeps a task's threads from training's CPU (fix 59).
        demote = (os.environ.get("FREERIDE_OFF_WINDOW_IDLE") == "1" and hasattr(os, "SCHED_IDLE")
                  and (placement is None or placement.sched != "idle"))
        if demote:
            nice = os.getpriority(os.PRIO_PROCESS, 0)
            problem = may_leave_idle(nice)
            if problem:
                log.info("the task's threads stay at nice %d between windows: %s", nice, problem)
                demote = False
        return cls(demote, report, clock_ns, spare=frozenset(threads()))

    # -- the wait ---------------------------------------------------------------------------------
    def enter(self) -> None:
        """The worker begins to wait holding no window (just before it blocks)."""
        if self._demote and not self._demoted:
            self._set_others()
        self._since = (self._clock_ns(), self._cpu_ns())

    def leave(self) -> None:
        """The wait ended (a grant, a command, anything): account it; report once when over the share."""
        wall0, cpu0 = self._since
        if not wall0:
            return
        self._since = (0, 0)
        self._waited_ns += self._clock_ns() - wall0
        self._spent_ns += self._cpu_ns() - cpu0
        if self._waited_ns < PERIOD_S * 1e9:
            return
        if not self.reported and self._spent_ns > SHARE * self._waited_ns:
            self.reported = True
            self._report(self._spent_ns, self._waited_ns)
        self._waited_ns = self._spent_ns = 0

    def restore(self) -> None:
        """A window was granted, or a checkpoint or stop begins: every demoted thread back to its policy."""
        demoted, self._demoted = self._demoted, {}
        for tid, policy in demoted.items():
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.sched_setscheduler(tid, policy, os.sched_param(0))

    def _set_others(self) -> None:
        me = threading.get_native_id()
        for tid in threads(self._tasks_dir):
            if tid == me or tid in self._spare:
                continue
            try:
                policy = os.sched_getscheduler(tid)
                if policy not in (os.SCHED_OTHER, os.SCHED_BATCH):  # idle or real-time: the task's own choice
                    continue
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except ProcessLookupError:
                continue
            self._demoted[tid] = policy

"""The worker's step gate: whether the next step fits the window this worker holds, decided before each step
from the window word and the step estimate (no round trip per step; the decision itself is freeride.worker.fit);
the waits between windows, for an unavailable resource or a full disk; the pipes it lives on; what it reports of
its steps (through an `Outbox`: freeride.worker.messages builds the messages). The worker's main thread calls it
(freeride.worker.process); the gRPC reader thread only sets `Shared`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from freeride.core import disk
from freeride.core.window import WindowReader, WindowWord
from freeride.errors import TaskStop, Unavailable
from freeride.worker.estimate import StepEstimator
from freeride.worker.fit import FAR_BEYOND, PROBE_AFTER_WINDOWS, Decision, Estimates, Held, Verdict, judge
from freeride.worker.offwindow import OffWindow
from freeride.worker.pipes import KnownPipes, PlumbingError
from freeride.worker.terms import Control, EndReason, Setup

__all__ = ["FAR_BEYOND", "MIN_RETRY_S", "PROBE_AFTER_WINDOWS", "Outbox", "PlumbingError", "Shared", "StepGate",
           "backoff_delays", "peak_rss_bytes"]

log = logging.getLogger("freeride.worker")

REPORT_BATCH = 256
PROGRESS_EVERY_S = 1.0
MIN_RETRY_S = 0.01  # the shortest wait between two available() calls, whatever a task asks
_CLOSES = {Verdict.REVOKED: EndReason.REVOKED, Verdict.EXPIRED: EndReason.EXPIRED, Verdict.NO_FIT: EndReason.NO_FIT}


class Outbox(Protocol):
    """What the gate says to the agent (freeride.worker.messages.Outbox)."""

    def steps(self, window_id: int, steps: Sequence[tuple[int, int]], progress: Mapping[str, float],
              peak_memory_bytes: int) -> None: ...

    def window_done(self, window_id: int, reason: EndReason, idle_ns: int, step_estimate_ns: int,
                    woke_ns: int) -> None: ...

    def waiting(self, reason: str, waiting: bool) -> None: ...


class Shared:
    """What the gRPC reader thread tells the main thread; `wake` interrupts its idle wait."""

    def __init__(self) -> None:
        self.control = Control.NONE
        self.lost = False
        self.setup: Setup | None = None
        self.setup_received = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass


class StepGate:
    """Decides when the next step may run; reports steps and closed windows."""

    def __init__(self, shared: Shared, outbox: Outbox, estimator: StepEstimator,
                 on_idle: Callable[[bool], None], clock: Callable[[], int] = time.monotonic_ns) -> None:
        """`on_idle(force)`: a window ended (False) or the agent asked for a checkpoint (True): the worker's
        chance to checkpoint between windows; `clock`: CLOCK_MONOTONIC in ns, the window word's clock."""
        self._s = shared
        self._out = outbox
        self.estimator = estimator
        self._on_idle = on_idle
        self._clock = clock
        self.window: WindowReader | None = None
        self._wid = 0
        self._until_ns = 0
        self._last_wid = 0
        self._waiting_for = ""  # the reason of the wait under way (Unavailable, a full disk); empty: none
        self._stepped = False  # whether a step ran in the current window
        self._steps: list[tuple[int, int]] = []  # (start_ns, duration_ns) of the steps not reported yet
        self.total_steps = 0
        self._piece_start_ns = 0
        self._progress_at = 0
        self.progress: Callable[[], Mapping[str, float]] = dict
        self.declared_step_s: Callable[[], float | None] = lambda: None  # the task's min_step_s(), if it sizes steps
        self._unfit_windows = 0  # windows in a row in which the declared smallest step did not fit
        self._woke_ns = 0  # when the idle wait ended, until the next read of the word
        self._saw_ns = 0  # when this worker saw the current window's grant (reported in its WindowDone)
        self._peak_bytes = 0  # this process's peak resident memory at the latest sample
        self._longest_window_ns = 0  # the longest window granted to this worker (from when it saw the grant)
        self._known = KnownPipes()  # each pipe's (device, inode) before any task code ran
        # The task's other threads between windows (SCHED_IDLE where it can be undone) and their CPU meanwhile.
        self.off_window = OffWindow(False, lambda cpu_ns, waited_ns: None, time.monotonic_ns)

    def estimate_ns(self) -> int | None:
        """What the next step is expected to take: the task's own smallest step if it declares one
        (IterativeTask.min_step_s), else a high percentile of the measured steps (else the warm-up step,
        when that was far beyond every window: see _measured_ns)."""
        declared = self._declared_ns()
        return declared if declared is not None else self._measured_ns()

    def _measured_ns(self) -> int | None:
        """The measured estimate; with none yet, the left-out warm-up step when it was far beyond the longest
        window (a step run to measure again could overrun by about as much: it is run once only, after a whole
        series of windows it fit none: freeride.worker.fit's PROBE)."""
        est = self.estimator.estimate_ns()
        if est is None:
            cold = self.estimator.cold_ns()
            if cold is not None and self._far_beyond(cold):
                return cold
        return est

    def _far_beyond(self, duration_ns: int) -> bool:
        return Estimates(longest_window_ns=self._longest_window_ns).far_beyond(duration_ns)

    def _declared_ns(self) -> int | None:
        try:
            declared = self.declared_step_s()
        except Exception:
            log.exception("min_step_s() raised; judging steps by their measured times")
            self.declared_step_s = lambda: None
            return None
        return int(declared * 1e9) if declared is not None and declared > 0 else None

    def remaining_s(self) -> float:
        """Seconds left in the window held; 0 outside one, and once the agent has revoked it (the word is re-read:
        a step that sizes itself unit by unit stops at the bubble's END, not at the predicted end)."""
        if not self._wid:
            return 0.0
        if self.window is not None:
            word = self.window.read()
            if word.window_id != self._wid or not word.open:
                return 0.0
        return max(0.0, (self._until_ns - self._clock()) / 1e9)

    def acquire(self) -> None:
        """Return when a step may start now; raise TaskStop when the worker must stop. Read the word, judge
        (freeride.worker.fit), act on the verdict; wait only when idle."""
        assert self.window is not None
        while True:
            self._stop_if_asked()
            word = self.window.read()
            woke, self._woke_ns = self._woke_ns, 0  # the wait just ended, if it did: the grant's wake-up
            decision = self._judge(word)
            if decision.verdict is Verdict.GRANTED:  # taken, and judged from the same word: no second read
                self._take(word, woke)
                decision = self._judge(word)
            self._unfit_windows = decision.unfit_windows
            verdict = decision.verdict
            if verdict in (Verdict.STEP, Verdict.PROBE):
                return
            if verdict is Verdict.OUTLIER:
                if self.estimator.forget_outlier(keep_above_ns=FAR_BEYOND * self._longest_window_ns):
                    continue  # granted, yet not one step fit a stale outlier: judge this window again
                verdict = Verdict.NO_FIT
            if verdict in _CLOSES:
                # (a window granted and revoked before this worker woke up is reported too, or the agent would
                # keep the task marked busy with a window it never ran in)
                self._wid = self._wid or word.window_id
                self.close(_CLOSES[verdict])
                continue
            if not self._checkpoint_if_asked():
                self._wait_for_word()

    def _judge(self, word: WindowWord) -> Decision:
        held = Held(self._wid, self._until_ns, self._last_wid, self._stepped, self._unfit_windows)
        if not self._wid:
            return judge(word, self._clock(), held, Estimates())
        declared = self._declared_ns()
        measured = self._measured_ns() if declared is None else None
        cold = measured is not None and self.estimator.estimate_ns() is None  # the warm-up step alone
        return judge(word, self._clock(), held, Estimates(declared, measured, self._longest_window_ns, cold))

    def _take(self, word: WindowWord, woke_ns: int) -> None:
        """A new window: the task's threads back to full speed, the window's end and when it was seen."""
        self.off_window.restore()
        self._wid, self._until_ns = word.window_id, word.until_ns
        self._stepped = False
        self._saw_ns = woke_ns or self._clock()
        self._longest_window_ns = max(self._longest_window_ns, self._until_ns - self._saw_ns)

    def _wait_for_word(self) -> None:
        """Idle: block until the agent writes the window word or the reader thread wakes us (no timeout)."""
        s = self._s
        assert self.window is not None
        self.off_window.enter()
        try:
            ready, _, _ = select.select([self.window.fd, s._wake_r], [], [])
        except OSError:
            self.check_pipes(everyone=True)
            raise
        finally:
            self.off_window.leave()
        self._woke_ns = self._clock()
        if s._wake_r in ready:  # only what is ready is read: a grant costs one read, no failed one
            s.drain()
        if self.window.fd in ready and not self.window.drain():
            s.lost = True

    def _stop_if_asked(self) -> None:
        """Raise TaskStop (closing any window held) on pause, cancel or a lost agent."""
        s = self._s
        if s.control in (Control.PAUSE, Control.CANCEL) or s.lost:
            if not self._wid and self.window is not None:
                word = self.window.read()
                if word.window_id > self._last_wid:
                    # Granted while this worker was idle, and not looked at yet: give it back before the
                    # checkpoint, or the agent would hold it busy and its hang timer would kill the checkpoint.
                    self._wid = word.window_id
            self.close(EndReason.STOPPING)
            self.off_window.restore()  # its checkpoint may need every thread it has
            raise TaskStop

    def _checkpoint_if_asked(self) -> bool:
        s = self._s
        if s.control is not Control.CHECKPOINT:
            return False
        s.control = Control.NONE
        self._on_idle(True)
        return True

    def wait_available(self, exc: Unavailable, available: Callable[[], bool]) -> None:
        """The step raised Unavailable: give the window back and wait, holding none, until `available()`.

        The agent hears WindowDone(UNAVAILABLE) and then WorkerWaiting(waiting=true), in that order
        on the stream, and grants nothing until WorkerWaiting(waiting=false). The wait blocks on the
        reader thread's wake-up pipe, so pause, cancel and a lost agent end it at once (TaskStop).
        """
        self._wait(str(exc.reason), exc.retry_s, exc.max_retry_s, available, asked_retries=False)

    def wait_for_disk(self, reason: str, written: Callable[[], bool]) -> None:
        """A checkpoint could not be written, the disk is full: wait as for an unavailable resource, holding no
        window, until `written()` (the checkpoint tried again) succeeds: with backoff, and at once when the agent
        asks for a checkpoint (it does after it freed space)."""
        self._wait(reason, disk.RETRY_S, disk.MAX_RETRY_S, written, asked_retries=True)

    def _wait(self, reason: str, retry_s: float, max_retry_s: float, available: Callable[[], bool],
              asked_retries: bool) -> None:
        """Wait holding no window until `available()`; `asked_retries`: a checkpoint the agent asks for ends the
        current delay (try now) instead of being taken. A wait inside another (a full disk while a task waits
        for its resource) gives the outer one's reason back when it ends, not "available"."""
        s = self._s
        assert self.window is not None
        outer = self._waiting_for
        self._waiting_for = reason
        self.close(EndReason.UNAVAILABLE)
        self._out.waiting(reason, True)
        log.info("task unavailable (%s); waiting, first retry in %ss", reason, retry_s)
        delays = backoff_delays(retry_s, max_retry_s)
        complained = False
        try:
            while True:
                deadline = self._clock() + int(next(delays) * 1e9)
                while True:  # until the deadline; a checkpoint asked meanwhile is taken, the wait goes on
                    self._stop_if_asked()
                    if asked_retries and s.control is Control.CHECKPOINT:
                        s.control = Control.NONE
                        break
                    if self._checkpoint_if_asked():
                        continue
                    left = deadline - self._clock()
                    if left <= 0:
                        break
                    select.select([s._wake_r], [], [], left / 1e9)
                    s.drain()
                self.forget_stale_grants()
                try:
                    if available():
                        break
                except Exception:
                    if not complained:  # once per wait: it may be called every few seconds for hours
                        log.warning("available() raised; counted as not available", exc_info=True)
                        complained = True
        finally:
            self._waiting_for = outer
        self.forget_stale_grants()
        if outer:
            self._out.waiting(outer, True)
            return
        self._out.waiting(reason, False)
        log.info("task available again (was: %s)", reason)

    def forget_stale_grants(self) -> None:
        """Grants written while the task waits are stale: the agent took the task out of its windows when it
        read WorkerWaiting(waiting=true), before any grant this worker could act on."""
        assert self.window is not None
        if not self.window.drain():
            self._s.lost = True
            self._stop_if_asked()
        self._last_wid = max(self._last_wid, self.window.read().window_id)

    def yield_point(self) -> None:
        """An imperative task finished a piece: account it, then wait until the next may run."""
        self.step_done(self._piece_start_ns, self._clock())
        self.acquire()
        self._piece_start_ns = self._clock()

    def begin_pieces(self) -> None:
        self.acquire()
        self._piece_start_ns = self._clock()

    def end_pieces(self) -> None:
        """An imperative task's run() returned: its last piece is a step too."""
        self.step_done(self._piece_start_ns, self._clock())

    def _pipes(self, everyone: bool) -> list[tuple[str, int]]:
        pipes = [("window pipe", self.window.fd if self.window is not None else -1)]
        if everyone:
            pipes += [("wake-up pipe", self._s._wake_r), ("wake-up pipe", self._s._wake_w)]
        return [(name, fd) for name, fd in pipes if fd >= 0]

    def know_pipes(self) -> None:
        """Before any task code runs: note which pipe each number is (freeride.worker.pipes)."""
        self._known.note(self._pipes(everyone=True))

    def check_pipes(self, everyone: bool = False) -> None:
        """Raise PlumbingError if the task closed the window pipe (or, `everyone`, the wake-up pipe too). After
        every step: one fstat."""
        self._known.check(self._pipes(everyone))

    def step_done(self, start_ns: int, end_ns: int) -> None:
        self.check_pipes()
        duration = end_ns - start_ns
        self._stepped = True
        self.estimator.add(duration)
        self._steps.append((start_ns, duration))
        self.total_steps += 1
        if len(self._steps) >= REPORT_BATCH:
            self._flush_steps()

    def close(self, reason: EndReason) -> None:
        if not self._wid:
            return
        idle_ns = self._clock()
        self._flush_steps()
        self._out.window_done(self._wid, reason, idle_ns, self.estimate_ns() or 0, self._saw_ns)
        self._last_wid, self._wid = self._wid, 0
        self._saw_ns = 0
        if reason not in (EndReason.STOPPING, EndReason.CHECKPOINT):
            self._on_idle(False)

    def give_back_unseen(self) -> None:
        """Before a checkpoint (idle, holding no window): give back a grant written since this worker last looked,
        or the agent would hold it busy through a checkpoint that answers no window."""
        if self._wid or self.window is None:
            return
        word = self.window.read()
        if word.window_id > self._last_wid:
            self._wid = word.window_id
            self.close(EndReason.CHECKPOINT)

    def _flush_steps(self) -> None:
        now = self._clock()
        progress: Mapping[str, float] = {}
        if not self._progress_at or now - self._progress_at >= PROGRESS_EVERY_S * 1e9:  # progress() may be costly
            self._progress_at = now
            progress = self.progress()
            self._peak_bytes = peak_rss_bytes()  # (sampled as seldom: it reads /proc)
        steps, self._steps = self._steps, []
        self._out.steps(self._wid, steps, progress, self._peak_bytes)


def peak_rss_bytes(status: Path = Path("/proc/self/status")) -> int:
    """This process's own peak resident memory (VmHWM; 0 where unknown).

    Not getrusage's ru_maxrss: the kernel carries a parent's high-water mark across fork and exec,
    so every worker would report the agent's peak. exec starts a new address space, whose VmHWM
    counts this process only.
    """
    try:
        for line in status.read_bytes().splitlines():
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def backoff_delays(retry_s: float, max_retry_s: float) -> Iterator[float]:
    """retry_s, then twice as long each time, never above max_retry_s (nor below MIN_RETRY_S)."""
    delay = max(retry_s, MIN_RETRY_S)
    cap = max(max_retry_s, delay)
    while True:
        yield min(delay, cap)
        delay = min(delay * 2, cap)

"""The side-task worker process: `python -m freeride.worker --agent ADDR --task-id ID --instance N`.

Spawned by the agent, one per task. It attaches over one bidirectional gRPC stream, receives
bubble windows through the window word (freeride.core.window), and decides locally, before every
step, whether the next step fits the window (no round trip per step). A reader thread turns
agent commands (setup, pause, cancel) into state changes; the main thread runs the user's code
and blocks on the wake-up pipes between windows.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pickle
import queue
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import grpc

from freeride.core import disk
from freeride.core.cpu import apply_from_env
from freeride.core.exits import NO_RESTART
from freeride.core.private import create_private
from freeride.core.window import WindowReader
from freeride.errors import TaskRefError, TaskStop, Unavailable
from freeride.sdk.task import ImperativeTask, IterativeTask, TaskContext
from freeride.v1 import worker_pb2 as pb
from freeride.v1 import worker_pb2_grpc
from freeride.worker._loader import bind_args, load_class
from freeride.worker._progress import BoundedProgress
from freeride.worker.estimate import StepEstimator

log = logging.getLogger("freeride.worker")

_REPORT_BATCH = 256
_PROBE_AFTER_WINDOWS = 8  # a task whose declared smallest step fit none of this many windows steps anyway
# A step is never run on no evidence (a probe, a step after the warm-up) when what is known of it is more than
# this many times the longest window this worker was granted: that step would overrun a bubble by seconds.
_FAR_BEYOND = 8
_PROGRESS_EVERY_S = 1.0
_CHECKPOINT_VERSION = 1  # the checkpoint file's format; _restore refuses any other
_MIN_RETRY_S = 0.01  # the shortest wait between two available() calls, whatever a task asks


class _CheckpointFormatError(Exception):
    """The task's checkpoint was written in a format this worker does not read."""


class _CheckpointError(Exception):
    """Taking, writing or restoring the task's checkpoint failed; the message names the part (state_dict(), ...)."""

    def __init__(self, message: str, disk_full: str = "") -> None:
        super().__init__(message)
        self.disk_full = disk_full  # the disk is full: the reason to wait with (freeride.core.disk), not a failure


class _PlumbingError(BaseException):
    """A pipe the worker lives on is gone (the task closed descriptors it did not open); the message says which.
    A BaseException, as TaskStop: a task's `except Exception` in run() must not swallow it."""


class _Shared:
    """What the gRPC reader thread tells the main thread; `wake` interrupts its idle wait."""

    def __init__(self) -> None:
        self.control = pb.CONTROL_ACTION_UNSPECIFIED
        self.lost = False
        self.setup: pb.WorkerSetup | None = None
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


class _Gate:
    """Decides when the next step may run; reports steps and closed windows."""

    def __init__(self, shared: _Shared, send: Any, estimator: StepEstimator, on_idle: Any) -> None:
        self._s = shared
        self._send = send
        self.estimator = estimator
        self._on_idle = on_idle
        self.window: WindowReader | None = None
        self._wid = 0
        self._until_ns = 0
        self._last_wid = 0
        self._waiting_for = ""  # the reason of the wait under way (Unavailable, a full disk); empty: none
        self._stepped = False  # whether a step ran in the current window
        self._steps: list[pb.Step] = []
        self.total_steps = 0
        self._piece_start_ns = 0
        self._progress_at = 0.0
        self.progress: Any = dict
        self.declared_step_s: Any = lambda: None  # the task's min_step_s(), when it sizes its own steps
        self._unfit_windows = 0  # windows in a row in which the declared smallest step did not fit
        self._woke_ns = 0  # when the idle wait ended, until the next read of the word
        self._saw_ns = 0  # when this worker saw the current window's grant (reported in its WindowDone)
        self._peak_bytes = 0  # this process's peak resident memory at the latest sample
        self._longest_window_ns = 0  # the longest window granted to this worker (from when it saw the grant)
        self._pipe_ids: dict[int, tuple[int, int]] = {}  # each pipe's (device, inode) before any task code ran

    def estimate_ns(self) -> int | None:
        """What the next step is expected to take: the task's own smallest step if it declares one
        (IterativeTask.min_step_s), else a high percentile of the measured steps (else the warm-up step,
        when that was far beyond every window: see _measured_ns)."""
        declared = self._declared_ns()
        return declared if declared is not None else self._measured_ns()

    def _measured_ns(self) -> int | None:
        """The measured estimate; with none yet, the left-out warm-up step when it was far beyond the longest
        window (a step run to measure again would overrun by about as much: it is not run)."""
        est = self.estimator.estimate_ns()
        if est is None:
            cold = self.estimator.cold_ns()
            if cold is not None and self._far_beyond(cold):
                return cold
        return est

    def _far_beyond(self, duration_ns: int) -> bool:
        return self._longest_window_ns > 0 and duration_ns > _FAR_BEYOND * self._longest_window_ns

    def _declared_ns(self) -> int | None:
        try:
            declared = self.declared_step_s()
        except Exception:
            log.exception("min_step_s() raised; judging steps by their measured times")
            self.declared_step_s = lambda: None
            return None
        return int(declared * 1e9) if declared is not None and declared > 0 else None

    def remaining_s(self) -> float:
        if not self._wid:
            return 0.0
        return max(0.0, (self._until_ns - time.monotonic_ns()) / 1e9)

    def acquire(self) -> None:
        """Return when a step may start now; raise TaskStop when the worker must stop."""
        s = self._s
        assert self.window is not None
        while True:
            self._stop_if_asked()
            word = self.window.read()
            woke, self._woke_ns = self._woke_ns, 0  # the wait just ended, if it did: the grant's wake-up
            if not self._wid and word.window_id > self._last_wid:
                if not word.open:
                    # Granted and revoked before this worker woke up: say so, or the agent would
                    # keep the task marked busy with a window it never ran in.
                    self._wid = word.window_id
                    self.close(pb.WINDOW_END_REASON_REVOKED)
                    continue
                # A new window: judged below from the same word (a grant's first step waits for no second read).
                self._wid, self._until_ns = word.window_id, word.until_ns
                self._stepped = False
                self._saw_ns = woke or time.monotonic_ns()
                self._longest_window_ns = max(self._longest_window_ns, self._until_ns - self._saw_ns)
            if self._wid:
                if word.window_id != self._wid or not word.open:
                    self.close(pb.WINDOW_END_REASON_REVOKED)
                    continue
                now = time.monotonic_ns()
                if now >= self._until_ns:
                    self.close(pb.WINDOW_END_REASON_EXPIRED)
                    continue
                declared = self._declared_ns()
                est = declared if declared is not None else self._measured_ns()
                if est is not None and now + est > self._until_ns:
                    if not self._stepped:
                        far = _FAR_BEYOND * self._longest_window_ns
                        if declared is None and self.estimator.forget_outlier(keep_above_ns=far):
                            continue  # granted, yet not one step fit a stale outlier: judge this window again
                        if declared is not None and not self._far_beyond(declared):
                            # Only a step can refresh what the task declares: after some windows it did
                            # not fit, one step (which sizes itself to what is left) lets it measure again.
                            self._unfit_windows += 1
                            if self._unfit_windows >= _PROBE_AFTER_WINDOWS:
                                self._unfit_windows = 0
                                return
                    self.close(pb.WINDOW_END_REASON_NO_FIT)
                    continue
                self._unfit_windows = 0
                return
            if self._checkpoint_if_asked():
                continue
            # Idle: block until the agent writes the window word or the reader thread wakes us.
            try:
                ready, _, _ = select.select([self.window.fd, s._wake_r], [], [])
            except OSError:
                self.check_pipes(everyone=True)
                raise
            self._woke_ns = time.monotonic_ns()
            if s._wake_r in ready:  # only what is ready is read: a grant costs one read, no failed one
                s.drain()
            if self.window.fd in ready and not self.window.drain():
                s.lost = True

    def _stop_if_asked(self) -> None:
        """Raise TaskStop (closing any window held) on pause, cancel or a lost agent."""
        s = self._s
        if s.control in (pb.CONTROL_ACTION_PAUSE, pb.CONTROL_ACTION_CANCEL) or s.lost:
            if not self._wid and self.window is not None:
                word = self.window.read()
                if word.window_id > self._last_wid:
                    # Granted while this worker was idle, and not looked at yet: give it back before the
                    # checkpoint, or the agent would hold it busy and its hang timer would kill the checkpoint.
                    self._wid = word.window_id
            self.close(pb.WINDOW_END_REASON_STOPPING)
            raise TaskStop

    def _checkpoint_if_asked(self) -> bool:
        s = self._s
        if s.control != pb.CONTROL_ACTION_CHECKPOINT:
            return False
        s.control = pb.CONTROL_ACTION_UNSPECIFIED
        self._on_idle(force=True)
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
        self.close(pb.WINDOW_END_REASON_UNAVAILABLE)
        self._send(pb.WorkerMessage(waiting=pb.WorkerWaiting(reason=reason, waiting=True)))
        log.info("task unavailable (%s); waiting, first retry in %ss", reason, retry_s)
        delays = backoff_delays(retry_s, max_retry_s)
        complained = False
        try:
            while True:
                deadline = time.monotonic() + next(delays)
                while True:  # until the deadline; a checkpoint asked meanwhile is taken, the wait goes on
                    self._stop_if_asked()
                    if asked_retries and s.control == pb.CONTROL_ACTION_CHECKPOINT:
                        s.control = pb.CONTROL_ACTION_UNSPECIFIED
                        break
                    if self._checkpoint_if_asked():
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    select.select([s._wake_r], [], [], left)
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
            self._send(pb.WorkerMessage(waiting=pb.WorkerWaiting(reason=outer, waiting=True)))
            return
        self._send(pb.WorkerMessage(waiting=pb.WorkerWaiting(reason=reason, waiting=False)))
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
        self.step_done(self._piece_start_ns, time.monotonic_ns())
        self.acquire()
        self._piece_start_ns = time.monotonic_ns()

    def begin_pieces(self) -> None:
        self.acquire()
        self._piece_start_ns = time.monotonic_ns()

    def _pipes(self, everyone: bool) -> list[tuple[str, int]]:
        pipes = [("window pipe", self.window.fd if self.window is not None else -1)]
        if everyone:
            pipes += [("wake-up pipe", self._s._wake_r), ("wake-up pipe", self._s._wake_w)]
        return [(name, fd) for name, fd in pipes if fd >= 0]

    def know_pipes(self) -> None:
        """Before any task code runs: note which pipe each number is, so that one the task closed is caught even
        when something it opened afterwards took its number."""
        for _, fd in self._pipes(everyone=True):
            st = os.fstat(fd)
            self._pipe_ids[fd] = (st.st_dev, st.st_ino)

    def check_pipes(self, everyone: bool = False) -> None:
        """Raise _PlumbingError if the task closed the window pipe (or, `everyone`, the wake-up pipe too), as
        os.closerange(3, ...) does: said here, in the task's log, before gRPC (whose descriptors went too)
        aborts with its own words. After every step: one fstat."""
        for name, fd in self._pipes(everyone):
            try:
                st = os.fstat(fd)
            except OSError as exc:
                problem = exc.strerror
            else:
                known = self._pipe_ids.get(fd)
                if known is None or known == (st.st_dev, st.st_ino):
                    continue
                problem = "its number now names another file"
            raise _PlumbingError(
                f"the worker's {name} (fd {fd}) was closed: {problem}; the task closed file descriptors "
                "it did not open (os.closerange, a daemonising helper): close only your own"
            )

    def step_done(self, start_ns: int, end_ns: int) -> None:
        self.check_pipes()
        duration = end_ns - start_ns
        self._stepped = True
        self.estimator.add(duration)
        self._steps.append(pb.Step(start_ns=start_ns, duration_ns=duration))
        self.total_steps += 1
        if len(self._steps) >= _REPORT_BATCH:
            self._flush_steps()

    def close(self, reason: pb.WindowEndReason) -> None:
        if not self._wid:
            return
        idle_ns = time.monotonic_ns()
        self._flush_steps()
        est = self.estimate_ns() or 0
        self._send(
            pb.WorkerMessage(
                window_done=pb.WindowDone(window_id=self._wid, reason=reason, idle_ns=idle_ns, step_estimate_ns=est,
                                          woke_ns=self._saw_ns)
            )
        )
        self._last_wid, self._wid = self._wid, 0
        self._saw_ns = 0
        if reason not in (pb.WINDOW_END_REASON_STOPPING, pb.WINDOW_END_REASON_CHECKPOINT):
            self._on_idle(force=False)

    def give_back_unseen(self) -> None:
        """Before a checkpoint (idle, holding no window): give back a grant written since this worker last looked,
        or the agent would hold it busy through a checkpoint that answers no window."""
        if self._wid or self.window is None:
            return
        word = self.window.read()
        if word.window_id > self._last_wid:
            self._wid = word.window_id
            self.close(pb.WINDOW_END_REASON_CHECKPOINT)

    def _flush_steps(self) -> None:
        now = time.monotonic()
        progress = {}
        if now - self._progress_at >= _PROGRESS_EVERY_S:  # progress() may be costly (an evaluation)
            self._progress_at = now
            progress = self.progress()
            self._peak_bytes = peak_rss_bytes()  # (sampled as seldom: it reads /proc)
        report = pb.StepReport(
            window_id=self._wid,
            steps=self._steps,
            progress=progress,
            peak_memory_bytes=self._peak_bytes,
        )
        self._steps = []
        self._send(pb.WorkerMessage(steps=report))


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
    """retry_s, then twice as long each time, never above max_retry_s (nor below _MIN_RETRY_S)."""
    delay = max(retry_s, _MIN_RETRY_S)
    cap = max(max_retry_s, delay)
    while True:
        yield min(delay, cap)
        delay = min(delay * 2, cap)


class Worker:
    def __init__(self, target: str, task_id: str, instance: int, window: WindowReader) -> None:
        self.task_id = task_id
        self.instance = instance
        self._s = _Shared()
        self._out: queue.SimpleQueue[pb.WorkerMessage | None] = queue.SimpleQueue()
        self._channel = grpc.insecure_channel(target)
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        self._ckpt_at = time.monotonic()
        self.task: IterativeTask | ImperativeTask | None = None
        self.gate = _Gate(self._s, self._out.put, StepEstimator(warmup_steps=1), self._maybe_checkpoint)
        self.gate.window = window  # mapped before any task code runs: whatever it closes, the word stays
        self.gate.know_pipes()

    # -- stream plumbing -------------------------------------------------------------------------
    def _requests(self) -> Iterator[pb.WorkerMessage]:
        while True:
            msg = self._out.get()
            if msg is None:
                return
            yield msg

    def _read(self, responses: Iterator[pb.AgentCommand]) -> None:
        s = self._s
        try:
            for cmd in responses:
                which = cmd.WhichOneof("body")
                if which == "control":
                    s.control = cmd.control.action
                    s.wake()
                elif which == "setup":
                    s.setup = cmd.setup
                    s.setup_received.set()
        except grpc.RpcError:  # the agent is gone (killed), with the log writer that reads our output
            _write_own_log()
        s.lost = True
        s.setup_received.set()
        s.wake()

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> int:
        responses = self._stub.Attach(self._requests())
        reader = threading.Thread(target=self._read, args=(responses,), name="freeride-agent-reader", daemon=True)
        reader.start()
        self._out.put(
            pb.WorkerMessage(hello=pb.WorkerHello(task_id=self.task_id, instance=self.instance, pid=os.getpid()))
        )
        self._s.setup_received.wait()
        setup = self._s.setup
        if setup is None:
            log.error("agent went away before sending the task setup")
            return 1
        try:
            code = self._run_task(setup)
        finally:
            self._out.put(None)
            reader.join(timeout=5)
            self._channel.close()
        return code

    def _plumbing_intact(self) -> None:
        """After the task's own code ran outside a step (its import and constructor, setup(), load_state_dict()):
        if it closed the worker's pipes, say so and exit before a message to the agent lets gRPC abort."""
        try:
            self.gate.check_pipes(everyone=True)
        except _PlumbingError as exc:
            _die(str(exc))

    def _run_task(self, setup: pb.WorkerSetup) -> int:
        try:
            cls = load_class(setup.task_ref)
            task = cls(**bind_args(cls, dict(setup.args)))
        except TaskRefError as exc:
            self._plumbing_intact()
            return self._fail(str(exc), retryable=False)
        except Exception as exc:
            self._plumbing_intact()
            return self._fail(f"constructing the task raised {type(exc).__name__}: {exc}", retryable=False)
        self._plumbing_intact()
        self.task = task
        self._setup = setup
        task.context = TaskContext(
            task_id=self.task_id,
            checkpoint_path=setup.checkpoint_path,
            device=os.environ.get("FREERIDE_DEVICE", "cpu"),  # the agent sets cuda:0 on a GPU
            mem_limit_bytes=setup.mem_limit_bytes,
            gpu=_gpu_index(os.environ.get("FREERIDE_GPU", "")),  # the agent's --gpu
            _runtime=self.gate,
        )
        bounded = BoundedProgress()  # never a message gRPC refuses (the stream would close: a silent death)
        self.gate.progress = lambda: bounded(task.progress())
        if isinstance(task, IterativeTask):
            self.gate.declared_step_s = task.min_step_s
        kind = "imperative" if isinstance(task, ImperativeTask) else "iterative"
        try:
            limit_torch_memory(setup.mem_limit_bytes, task.context.device, before_setup=True)
            task.setup()
            limit_torch_memory(setup.mem_limit_bytes, task.context.device, before_setup=False)
        except Exception as exc:
            self._plumbing_intact()
            return self._fail(f"setup raised {type(exc).__name__}: {exc}", retryable=True)
        try:
            resumed = self._restore()
        except _CheckpointFormatError as exc:  # a retry would read the same file: fail once, say what to do
            self._plumbing_intact()
            return self._fail(str(exc), retryable=False)
        except _CheckpointError as exc:
            self._plumbing_intact()
            return self._fail(str(exc), retryable=True)
        self._plumbing_intact()
        self._out.put(
            pb.WorkerMessage(ready=pb.WorkerReady(kind=kind, resumed_steps=resumed, progress=self.gate.progress()))
        )
        try:
            if isinstance(task, ImperativeTask):
                self.gate.begin_pieces()
                task.run()
                self.gate.step_done(self.gate._piece_start_ns, time.monotonic_ns())
            else:
                while not task.is_done():
                    self.gate.acquire()
                    start = time.monotonic_ns()
                    try:
                        task.step()
                    except Unavailable as exc:  # not a step: no sample, no Step; wait holding no window
                        self.gate.wait_available(exc, task.available)
                        continue
                    self.gate.step_done(start, time.monotonic_ns())
            self.gate.close(pb.WINDOW_END_REASON_DONE)
            self._checkpoint_or_wait()
        except TaskStop:
            return self._stop()
        except _PlumbingError as exc:
            _die(str(exc))
        except _CheckpointError as exc:  # a checkpoint between windows: not the step's fault
            return self._fail(str(exc))
        except Unavailable as exc:  # from run() (or is_done()): only a step can be given back and retried
            where = "run()" if kind == "imperative" else "is_done()"
            return self._fail(f"{where} raised Unavailable ({exc.reason}); Unavailable is for IterativeTask.step(): "
                              "raise it there to wait for a resource without holding a window", retryable=False)
        except SystemExit as exc:
            return self._fail(f"{'run' if kind == 'imperative' else 'step'}() called sys.exit({exc.code})")
        except Exception as exc:
            return self._fail(f"{'run' if kind == 'imperative' else 'step'}() raised {type(exc).__name__}: {exc}")
        progress = self.gate.progress()
        self._teardown()
        self._out.put(pb.WorkerMessage(finished=pb.WorkerFinished(progress=progress)))
        return 0

    def _stop(self) -> int:
        """Pause, cancel or a lost agent: save the state so nothing is lost, then exit."""
        try:
            self._checkpoint()
        except _CheckpointError as exc:  # the agent puts it in the paused or cancelled task's reason
            return self._fail(str(exc))
        self._teardown()
        return 0

    def _fail(self, reason: str, retryable: bool = True) -> int:
        traceback.print_exc()
        self._out.put(pb.WorkerMessage(failed=pb.WorkerFailed(reason=reason, retryable=retryable)))
        if self.task is not None:
            self._teardown()
        return 1

    def _teardown(self) -> None:
        assert self.task is not None
        try:
            self.task.teardown()
        except Exception:
            log.exception("teardown raised")

    # -- checkpoints -----------------------------------------------------------------------------
    def _maybe_checkpoint(self, force: bool) -> None:
        interval = self._setup.checkpoint_interval_s
        if force or (interval > 0 and time.monotonic() - self._ckpt_at >= interval):
            self._checkpoint_or_wait()

    def _checkpoint_or_wait(self) -> None:
        """A checkpoint; on a full disk the task waits, holding no window, until it is written (no failure, no
        restart: the state is still in this process, and the steps it would lose are not run meanwhile)."""
        try:
            self._checkpoint()
        except _CheckpointError as exc:
            if not exc.disk_full:
                raise
            log.warning("%s; waiting for space", exc)
            self.gate.wait_for_disk(exc.disk_full, self._checkpoint_written)

    def _checkpoint_written(self) -> bool:
        try:
            self._checkpoint()
        except _CheckpointError as exc:
            if not exc.disk_full:
                raise
            return False
        return True

    def _checkpoint(self) -> None:
        """Take and write a checkpoint, telling the agent when it begins and ends: it is no step, whoever asked
        for it (the interval, the task's end, pause, cancel, shutdown), so the agent grants no window and arms
        no hang timer meanwhile; --checkpoint-timeout-s bounds it."""
        assert self.task is not None
        self._ckpt_at = time.monotonic()
        self.gate.give_back_unseen()
        self._out.put(pb.WorkerMessage(checkpointing=pb.WorkerCheckpointing(active=True)))
        try:
            self._write_checkpoint()
        finally:
            self._ckpt_at = time.monotonic()  # the interval runs between checkpoints, not from one's start
            self._out.put(pb.WorkerMessage(checkpointing=pb.WorkerCheckpointing(active=False)))

    def _write_checkpoint(self) -> None:
        assert self.task is not None
        try:
            state = self.task.state_dict()
        except Exception as exc:
            raise _CheckpointError(f"state_dict() raised {type(exc).__name__}: {exc}") from exc
        if state is None:
            return
        path = Path(self._setup.checkpoint_path)
        payload = {
            "version": _CHECKPOINT_VERSION,
            "steps": self.gate.total_steps,
            "state": state,
            "step_samples_ns": self.gate.estimator.samples(),
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            with os.fdopen(create_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
                pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a partial file: its space goes back (the previous checkpoint stays)
                tmp.unlink()
            full = disk.wait_reason("its checkpoint cannot be written to", path.parent, exc) if disk.is_full(exc) \
                else ""
            raise _CheckpointError(f"writing the checkpoint {path} failed: {exc}", disk_full=full) from exc
        except Exception as exc:  # pickle's errors: PicklingError, TypeError, AttributeError
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise _CheckpointError(
                f"what state_dict() returned cannot be pickled: {type(exc).__name__}: {exc}") from exc
        self._out.put(
            pb.WorkerMessage(
                checkpointed=pb.Checkpointed(steps=self.gate.total_steps, path=str(path), progress=self.gate.progress())
            )
        )

    def _restore(self) -> int:
        assert self.task is not None
        path = Path(self._setup.checkpoint_path)
        if not self._setup.checkpoint_path or not path.exists():
            return 0
        with open(path, "rb") as f:
            payload = pickle.load(f)
        version = payload.get("version") if isinstance(payload, dict) else None
        if version != _CHECKPOINT_VERSION:
            raise _CheckpointFormatError(
                f"checkpoint {path} is in format {version!r}, and this freeride reads format {_CHECKPOINT_VERSION}; "
                "move the file away (it is kept) to start the task from scratch, or resume it with the freeride "
                "that wrote it"
            )
        try:
            self.task.load_state_dict(payload["state"])
        except Exception as exc:
            raise _CheckpointError(
                f"load_state_dict() raised {type(exc).__name__}: {exc} (restoring {path}; move it away to start "
                "the task from scratch)") from exc
        self.gate.total_steps = int(payload["steps"])
        self.gate.estimator.load(list(payload.get("step_samples_ns", [])))
        return self.gate.total_steps


def _write_own_log(environ: dict[str, str] | None = None) -> bool:
    """The agent is gone, and with it the log writer that reads this worker's output pipe: point stdout and
    stderr at the task's log file (FREERIDE_LOG_FILE, set by the agent), so the output of the final checkpoint
    is kept rather than failing with BrokenPipeError. False when there is no such file to write to."""
    path = (os.environ if environ is None else environ).get("FREERIDE_LOG_FILE", "")
    if not path:
        return False
    try:
        fd = create_private(Path(path))
    except OSError:
        return False
    try:
        for target in (1, 2):
            os.dup2(fd, target)  # (dup2 clears close-on-exec on the target: children still inherit them)
    finally:
        os.close(fd)
    return True


def _die(reason: str) -> NoReturn:
    """Say why in the task's log (the agent makes its last line the reason) and exit at once with NO_RESTART
    (the task would do it again): the stream to the agent is not to be trusted, and gRPC would abort with its
    own words on its way down."""
    with contextlib.suppress(OSError):
        os.write(2, f"{reason}\n".encode())
    os._exit(NO_RESTART)


def _gpu_index(raw: str) -> int:
    """FREERIDE_GPU as the agent set it; -1 when absent or not a number (a worker started by hand)."""
    try:
        return int(raw)
    except ValueError:
        return -1


_torch_limited = False


def limit_torch_memory(cap_bytes: int, device: str, before_setup: bool) -> None:
    """Cap PyTorch's caching allocator at the task's memory cap (a second line behind MPS's pinned limit).

    Before setup only when the agent put the worker on a GPU (importing torch costs a second);
    after setup for any task that initialised CUDA itself. The MPS client settings are already in
    the environment (the agent spawned the worker with them), so creating the context here is safe.
    """
    global _torch_limited
    if cap_bytes <= 0 or _torch_limited:
        return
    if before_setup and not device.startswith("cuda"):
        return
    torch: Any = sys.modules.get("torch")
    if torch is None:
        if not before_setup:
            return
        try:
            import torch
        except ImportError:
            return
    if not torch.cuda.is_available() or (not before_setup and not torch.cuda.is_initialized()):
        return
    index = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), index)
    _torch_limited = True
    log.info("torch memory fraction on cuda:%d set to %.3f (cap %d MiB)", index, cap_bytes / total, cap_bytes >> 20)


def _apply_placement() -> bool:
    """The CPU placement the agent chose (--worker-nice/-cpus/-sched), applied before the task starts anything."""
    problem = apply_from_env(os.environ)
    if problem:
        log.error("cannot run at the CPU placement the agent chose: %s", problem)
    return not problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freeride-worker")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--instance", type=int, required=True)
    parser.add_argument("--window-word-fd", type=int, required=True, help="the window word (a sealed memfd)")
    parser.add_argument("--window-fd", type=int, required=True, help="read end of the agent's wake-up pipe")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not _apply_placement():
        return 2
    window = WindowReader(ns.window_word_fd, ns.window_fd)
    return Worker(ns.agent, ns.task_id, ns.instance, window).run()


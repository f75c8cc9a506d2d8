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
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from freeride.core.cpu import Placement
from freeride.core.exits import NO_RESTART, REASON_MARK
from freeride.core.private import create_private
from freeride.core.version import WORKER_PROTOCOL
from freeride.core.window import WindowReader
from freeride.errors import PermanentError, TaskRefError, TaskStop, Unavailable
from freeride.sdk.task import ImperativeTask, IterativeTask, TaskContext
from freeride.worker import checkpoint, green, protocol
from freeride.worker._loader import bind_args, load_class
from freeride.worker._progress import BoundedProgress
from freeride.worker.checkpoint import Checkpoint, CheckpointError, CheckpointFormatError
from freeride.worker.estimate import StepEstimator
from freeride.worker.gate import PlumbingError, Shared, StepGate
from freeride.worker.leftovers import kill_own_leftovers
from freeride.worker.messages import AgentLink
from freeride.worker.offwindow import OffWindow
from freeride.worker.placement import apply_cpu_placement, env_int, gpu_index, limit_torch_memory
from freeride.worker.terms import Control, EndReason, Setup

log = logging.getLogger("freeride.worker")


class Worker:
    def __init__(self, target: str, task_id: str, instance: int, window: WindowReader) -> None:
        self.task_id = task_id
        self.instance = instance
        self._s = Shared()
        self.link = AgentLink(target)
        self._out = self.link.outbox
        self._ckpt_at = time.monotonic()
        self._output_lock = threading.Lock()
        self._output_owned = False  # stdout and stderr go to the task's log file itself (the agent is gone)
        self.task: IterativeTask | ImperativeTask | None = None
        self.gate = StepGate(self._s, self._out, StepEstimator(warmup_steps=1), self._maybe_checkpoint)
        self.gate.window = window  # mapped before any task code runs: whatever it closes, the word stays
        self.gate.know_pipes()

    # -- what the reader thread hands on -----------------------------------------------------------
    def _on_setup(self, setup: Setup) -> None:
        self._s.setup = setup
        self._s.setup_received.set()

    def _on_control(self, control: Control) -> None:
        self._s.control = control
        self._s.wake()

    def _on_lost(self, broken: bool) -> None:
        if broken:  # the agent is gone (killed), with the log writer that reads our output
            self._own_output()
        self._s.lost = True
        self._s.setup_received.set()
        self._s.wake()

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> int:
        self.link.open(self._on_setup, self._on_control, self._on_lost)
        self._out.hello(self.task_id, self.instance, os.getpid())
        self._s.setup_received.wait()
        setup = self._s.setup
        if setup is None:
            log.error("agent went away before sending the task setup")
            return 1
        try:
            code = self._run_task(setup)
            if self._s.lost:  # (its checkpoint is taken) nobody else may end what the task left: records.py
                kill_own_leftovers()
        finally:
            self.link.close()
        return code

    def _plumbing_intact(self) -> None:
        """After the task's own code ran outside a step (its import and constructor, setup(), load_state_dict()):
        if it closed the worker's pipes, say so and exit before a message to the agent lets gRPC abort."""
        try:
            self.gate.check_pipes(everyone=True)
        except PlumbingError as exc:
            _die(str(exc))

    def _run_task(self, setup: Setup) -> int:
        # Before any task code: the threads running now (this one, gRPC's) are the worker's own, never demoted.
        self.gate.off_window = OffWindow.for_placement(Placement.from_env(os.environ), self._burned_off_window,
                                                       time.monotonic_ns)
        try:
            cls = load_class(setup.task_ref)
            task = cls(**bind_args(cls, dict(setup.args)))
        except TaskRefError as exc:
            self._plumbing_intact()
            return self._fail(str(exc), retryable=False)
        except PermanentError as exc:
            self._plumbing_intact()
            return self._fail(f"the task's constructor: {exc}", retryable=False)
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
            gpu=gpu_index(),  # the agent's --gpu
            _runtime=self.gate,
        )
        bounded = BoundedProgress()  # never a message gRPC refuses (the stream would close: a silent death)
        self.gate.progress = lambda: bounded(task.progress())
        if isinstance(task, IterativeTask):
            self.gate.declared_step_s = task.min_step_s
        kind = "imperative" if isinstance(task, ImperativeTask) else "iterative"
        try:
            limit_torch_memory(setup.mem_limit_bytes, task.context.device, before_setup=True)
            if said := green.enter(env_int(os.environ.get("FREERIDE_GREEN_SMS", "")), task.context.device):
                log.info("%s", said)
            task.setup()
            limit_torch_memory(setup.mem_limit_bytes, task.context.device, before_setup=False)
        except PermanentError as exc:  # the task knows a restart would meet it again: no restart
            self._plumbing_intact()
            return self._fail(f"setup(): {exc}", retryable=False)
        except Exception as exc:
            self._plumbing_intact()
            return self._fail(f"setup raised {type(exc).__name__}: {exc}", retryable=True)
        try:
            resumed = self._restore()
        except CheckpointFormatError as exc:  # a retry would read the same file: fail once, say what to do
            self._plumbing_intact()
            return self._fail(str(exc), retryable=False)
        except CheckpointError as exc:
            self._plumbing_intact()
            return self._fail(str(exc), retryable=True)
        self._plumbing_intact()
        self._out.ready(kind, resumed, self.gate.progress())
        try:
            if isinstance(task, ImperativeTask):
                self.gate.begin_pieces()
                task.run()
                self.gate.end_pieces()
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
            self.gate.close(EndReason.DONE)
            self._checkpoint_or_wait()
        except TaskStop:
            return self._stop()
        except PlumbingError as exc:
            _die(str(exc))
        except CheckpointError as exc:  # a checkpoint between windows: not the step's fault
            return self._fail(str(exc))
        except Unavailable as exc:  # from run() (or is_done()): only a step can be given back and retried
            where = "run()" if kind == "imperative" else "is_done()"
            return self._fail(f"{where} raised Unavailable ({exc.reason}); Unavailable is for IterativeTask.step(): "
                              "raise it there to wait for a resource without holding a window", retryable=False)
        except PermanentError as exc:
            return self._fail(f"{'run' if kind == 'imperative' else 'step'}(): {exc}", retryable=False)
        except SystemExit as exc:
            return self._fail(f"{'run' if kind == 'imperative' else 'step'}() called sys.exit({exc.code})")
        except Exception as exc:
            return self._fail(f"{'run' if kind == 'imperative' else 'step'}() raised {type(exc).__name__}: {exc}")
        progress = self.gate.progress()
        self._teardown()
        self._out.finished(progress)
        return 0

    def _burned_off_window(self, cpu_ns: int, waited_ns: int) -> None:
        log.warning("the task used %.0f%% of a core while it held no window (%.1f s of CPU in %.1f s of waiting): "
                    "a thread or process it started keeps running between steps; stop it when step() returns",
                    100 * cpu_ns / waited_ns, cpu_ns / 1e9, waited_ns / 1e9)
        self._out.idle_cpu(cpu_ns, waited_ns)

    def _own_output(self) -> None:
        """Once: stdout and stderr to the task's own log file (_write_own_log), the agent's log writer being gone."""
        with self._output_lock:
            if not self._output_owned:
                self._output_owned = _write_own_log()

    def _stop(self) -> int:
        """Pause, cancel or a lost agent: save the state so nothing is lost, then exit."""
        if self._s.lost:  # (seen first by the window pipe, maybe, before the stream's reader thread saw it)
            self._own_output()
        try:
            self._checkpoint()
        except CheckpointError as exc:  # the agent puts it in the paused or cancelled task's reason
            return self._fail(str(exc))
        self._teardown()
        return 0

    def _fail(self, reason: str, retryable: bool = True) -> int:
        traceback.print_exc()
        self._out.failed(reason, retryable)
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
        except CheckpointError as exc:
            if not exc.disk_full:
                raise
            log.warning("%s; waiting for space", exc)
            self.gate.wait_for_disk(exc.disk_full, self._checkpoint_written)

    def _checkpoint_written(self) -> bool:
        try:
            self._checkpoint()
        except CheckpointError as exc:
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
        self.gate.off_window.restore()  # a checkpoint between windows may need every thread the task has
        self.gate.give_back_unseen()
        self._out.checkpointing(True)
        try:
            self._write_checkpoint()
        finally:
            self._ckpt_at = time.monotonic()  # the interval runs between checkpoints, not from one's start
            self._out.checkpointing(False)

    def _write_checkpoint(self) -> None:
        assert self.task is not None
        try:
            state = self.task.state_dict()
        except Exception as exc:
            raise CheckpointError(f"state_dict() raised {type(exc).__name__}: {exc}") from exc
        if state is None:
            return
        path = Path(self._setup.checkpoint_path)
        checkpoint.write(path, Checkpoint(self.gate.total_steps, state, self.gate.estimator.samples()))
        self._out.checkpointed(self.gate.total_steps, str(path), self.gate.progress())

    def _restore(self) -> int:
        assert self.task is not None
        if not self._setup.checkpoint_path:
            return 0
        path = Path(self._setup.checkpoint_path)
        found = checkpoint.read(path)
        if found is None:
            return 0
        try:
            self.task.load_state_dict(found.state)
        except PermanentError as exc:
            raise CheckpointFormatError(f"load_state_dict(): {exc} (restoring {path}; move it away to start the "
                                        "task from scratch)") from exc
        except Exception as exc:
            raise CheckpointError(
                f"load_state_dict() raised {type(exc).__name__}: {exc} (restoring {path}; move it away to start "
                "the task from scratch)") from exc
        self.gate.total_steps = found.steps
        self.gate.estimator.load(found.step_samples_ns)
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
    """Say why in the task's log, marked (freeride.core.exits: the agent makes that line the reason), and exit
    at once with NO_RESTART (the task would do it again): the stream to the agent is not to be trusted, and
    gRPC would abort with its own words on its way down."""
    with contextlib.suppress(OSError):
        os.write(2, f"{REASON_MARK}{reason}\n".encode())
    os._exit(NO_RESTART)


class _PrintProtocol(argparse.Action):
    """`--protocol`: the one JSON line of protocol.answer(), unwrapped (argparse's version action wraps it)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(protocol.answer(), flush=True)
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freeride-worker")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--instance", type=int, required=True)
    parser.add_argument("--window-word-fd", type=int, required=True, help="the window word (a sealed memfd)")
    parser.add_argument("--window-fd", type=int, required=True, help="read end of the agent's wake-up pipe")
    parser.add_argument("--agent-protocol", type=int, default=WORKER_PROTOCOL,
                        help="the agent's worker protocol: a worker that speaks another one exits at once")
    parser.add_argument("--agent-version", default="", help="the agent's freeride version (said on a mismatch)")
    parser.add_argument("--protocol", action=_PrintProtocol, nargs=0,
                        help="print this freeride's worker protocol, version and Python as JSON, and exit")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    wrong = protocol.mismatch(ns.agent_protocol, ns.agent_version)
    if wrong:  # told the agent in the log, marked: the task FAILS with it, no restart (freeride.core.exits)
        print(REASON_MARK + wrong, file=sys.stderr, flush=True)
        return NO_RESTART
    if not apply_cpu_placement():
        return 2
    window = WindowReader(ns.window_word_fd, ns.window_fd)
    return Worker(ns.agent, ns.task_id, ns.instance, window).run()


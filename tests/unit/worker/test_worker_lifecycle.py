"""The worker's end of a task's life, in-process: stop and checkpoint, restore, what it reports and in whose words.

A Worker is built without an agent (its gRPC channel is never used): the tests call its checkpoint and
restore paths directly and read the messages it queued for the agent.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.disk import fill, small_disk
from support.paths import TASK_FILES
from support.worker import Harness

from freeride import TaskStop
from freeride.core.window import WindowReader, WindowWriter
from freeride.v1 import worker_pb2 as pb
from freeride.worker.process import Worker
from freeride.worker.terms import Control, Setup


def test_a_window_granted_but_not_yet_seen_when_a_stop_arrives_is_given_back_before_the_checkpoint(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.writer.grant(1, time.monotonic_ns() + 10**9)  # the grant and the cancel wake the idle worker together
    h.control(pb.CONTROL_ACTION_CANCEL)
    with pytest.raises(TaskStop):
        h.gate.acquire()
    assert h.done() == [(1, pb.WINDOW_END_REASON_STOPPING)]  # else the agent's hang timer kills the checkpoint


# -- bug 5: the worker's own peak memory, not its parent's ------------------------------------------
_REPORT_PEAK = """
from freeride.worker.estimate import StepEstimator
from freeride.worker.gate import Shared, StepGate
from freeride.worker.messages import Outbox
sent = []
gate = StepGate(Shared(), Outbox(sent.append), StepEstimator(), lambda force: None)
gate._flush_steps()
print(sent[0].steps.peak_memory_bytes)
"""
_BIG_PARENT = """
import subprocess, sys
held = b"x" * (400 << 20)  # written: 400 MiB resident, the parent's high-water mark
del held
print(subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, check=True).stdout)
"""


def test_a_worker_started_by_a_parent_with_a_high_peak_reports_its_own_small_peak() -> None:
    out = subprocess.run([sys.executable, "-c", _BIG_PARENT, _REPORT_PEAK], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    peak = int(out.strip())
    assert 10 << 20 < peak < 200 << 20  # a Python with grpc loaded; ru_maxrss would say the parent's 400+ MiB


_PEAK_THEN_SHRINK = """
import psutil
held = b"x" * (300 << 20)  # written: 300 MiB resident at this process's high-water mark
del held  # (a block this large is unmapped at once: resident memory falls back)
now = psutil.Process().memory_info().rss
""" + _REPORT_PEAK + "print(now)\n"


def test_the_reported_peak_is_the_high_water_mark_not_the_memory_held_now() -> None:
    out = subprocess.run([sys.executable, "-c", _PEAK_THEN_SHRINK], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    peak, now = int(out[0]), int(out[1])
    assert now < 200 << 20, "the precondition: the process shrank again after its peak"
    assert peak >= 300 << 20, f"reported {peak >> 20} MiB: the memory held now ({now >> 20} MiB), not the peak"


# -- bug 6a/6b: a checkpoint's failure is named for the method that failed --------------------------
LIFECYCLE = TASK_FILES / "lifecycle.py"


class InProcessWorker:
    """A Worker's task loop on a thread of this process: windows through a real window word, its messages
    to the agent read off its queue (nothing is sent: its gRPC channel is never used)."""

    def __init__(self, tmp_path: Path, name: str, **args: object) -> None:
        self.writer = WindowWriter()
        self.checkpoint = tmp_path / "task.ckpt"
        self.worker = Worker("unix:/nonexistent", "1", 1, WindowReader(*self.writer.child_fds()))
        self.setup = Setup(task_ref=f"{LIFECYCLE}:{name}", args={k: str(v) for k, v in args.items()},
                                    checkpoint_path=str(self.checkpoint), checkpoint_interval_s=0.001)
        self.code: list[int] = []
        self._thread = threading.Thread(target=lambda: self.code.append(self.worker._run_task(self.setup)),
                                        daemon=True)

    def start(self) -> InProcessWorker:
        self._thread.start()
        return self

    def next(self, kind: str) -> pb.WorkerMessage:
        """The next message of this kind (those before it are skipped)."""
        while True:
            msg = self.worker.link.queue.get(timeout=10)
            assert msg is not None
            if msg.WhichOneof("body") == kind:
                return msg

    def until(self, kind: str) -> tuple[list[str], pb.WorkerMessage]:
        """The kinds of the messages before the next one of `kind`, and that one."""
        seen: list[str] = []
        while True:
            msg = self.worker.link.queue.get(timeout=10)
            assert msg is not None
            body = str(msg.WhichOneof("body"))
            if body == kind:
                return seen, msg
            seen.append(body)

    def exit_code(self) -> int:
        self._thread.join(10)
        return self.code[0]


def test_a_state_dict_that_raises_between_windows_is_reported_as_state_dict_not_as_the_step(tmp_path: Path) -> None:
    w = InProcessWorker(tmp_path, "BadStateDict").start()
    w.next("ready")
    w.writer.grant(1, time.monotonic_ns() + 20_000_000)  # steps for 20 ms, then the periodic checkpoint
    failed = w.next("failed").failed
    assert failed.reason == "state_dict() raised RuntimeError: cannot gather the state"
    assert failed.retryable and w.exit_code() == 1


def test_a_state_dict_that_raises_on_cancel_is_reported_not_lost_in_a_traceback(tmp_path: Path) -> None:
    w = InProcessWorker(tmp_path, "BadStateDict").start()
    w.next("ready")
    w.worker._s.control = Control.CANCEL
    w.worker._s.wake()
    assert w.next("failed").failed.reason == "state_dict() raised RuntimeError: cannot gather the state"
    assert w.exit_code() == 1


def test_a_load_state_dict_that_raises_is_reported_as_load_state_dict_not_as_setup(tmp_path: Path) -> None:
    w = InProcessWorker(tmp_path, "BadLoad")
    with open(w.checkpoint, "wb") as f:
        pickle.dump({"version": 1, "steps": 7, "state": {"count": 7}}, f)
    w.start()
    failed = w.next("failed").failed
    assert failed.reason == (f"load_state_dict() raised KeyError: 'weights' (restoring {w.checkpoint}; "
                             "move it away to start the task from scratch)")
    assert failed.retryable and w.exit_code() == 1


# -- a task that cannot run as given: FAILED at once, no restart ----------------------------------
def test_a_permanent_error_in_setup_is_not_retryable(tmp_path: Path) -> None:
    """A prompt the model cannot take failed in setup() after three pointless restarts (round 3, item 7)."""
    w = InProcessWorker(tmp_path, "CannotRunHere").start()
    failed = w.next("failed").failed
    assert failed.reason == "setup(): prompts.jsonl line 3: an empty prompt"
    assert not failed.retryable and w.exit_code() == 1


def test_a_permanent_error_in_a_step_is_not_retryable(tmp_path: Path) -> None:
    w = InProcessWorker(tmp_path, "CannotRunHere", where="step").start()
    w.next("ready")
    w.writer.grant(1, time.monotonic_ns() + 10**9)
    failed = w.next("failed").failed
    assert failed.reason == "step(): item 7 holds token 300; the model's ids are 0..255"
    assert not failed.retryable and w.exit_code() == 1


# -- a full disk: the checkpoint waits, the task does not fail ---------------------------------------
def test_a_checkpoint_on_a_full_disk_waits_holding_no_window_and_is_written_once_space_is_freed(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", 1 << 20) as mount:
        w = InProcessWorker(mount, "Counter")  # its window word and checkpoint on the small disk
        filler = mount / "filler"
        fill(filler)
        w.start()
        w.next("ready")
        w.writer.grant(1, time.monotonic_ns() + 20_000_000)  # steps for 20 ms, then the periodic checkpoint
        seen, waiting = w.until("waiting")
        assert "failed" not in seen and waiting.waiting.waiting  # no failure: the worker (and its state) lives on
        reason = waiting.waiting.reason
        assert reason.startswith(f"disk full: its checkpoint cannot be written to {mount} (No space left on device)")
        assert not w.checkpoint.with_suffix(".ckpt.tmp").exists()  # the partial file's space went back
        filler.unlink()  # freeride rm freed space, and the agent asks the waiting worker to try again
        w.worker._s.control = Control.CHECKPOINT
        w.worker._s.wake()
        seen, written = w.until("checkpointed")
        assert "failed" not in seen and written.checkpointed.steps > 0
        seen, back = w.until("waiting")
        assert (back.waiting.reason, back.waiting.waiting) == (reason, False)  # the agent schedules it again
        assert pickle.loads(w.checkpoint.read_bytes())["steps"] == written.checkpointed.steps
        w.worker._s.control = Control.CANCEL
        w.worker._s.wake()
        assert w.exit_code() == 0

"""The worker's step gate, driven through a real window word and pipe (no agent, no gRPC)."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.worker import Harness

from freeride import TaskStop, Unavailable
from freeride.v1 import worker_pb2 as pb
from freeride.worker.estimate import StepEstimator
from freeride.worker.gate import MIN_RETRY_S, PROBE_AFTER_WINDOWS, PlumbingError, backoff_delays
from freeride.worker.placement import gpu_index
from freeride.worker.terms import Control, EndReason


def test_a_window_revoked_before_the_worker_woke_is_reported_done_so_the_task_is_not_left_busy(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    far = time.monotonic_ns() + 10**9
    h.writer.grant(1, far)
    h.writer.revoke(1, far)  # the bubble ended before the worker read the word
    waiter = h.acquire_in_background()
    assert h.window_done.wait(5)
    assert h.done() == [(1, pb.WINDOW_END_REASON_REVOKED)]
    assert waiter.is_alive()  # and it waits for the next window
    h.writer.grant(2, far)  # the agent may grant again only now: the task is idle
    waiter.join(5)
    assert not waiter.is_alive() and h.gate.remaining_s() > 0.5


def test_the_gate_closes_a_window_when_the_next_step_would_not_fit(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.writer.grant(1, time.monotonic_ns() + 10**9)
    h.gate.acquire()
    start = time.monotonic_ns()
    h.gate.step_done(start, start + 2 * 10**9)  # a step that took 2 s (recorded, not slept: no clock race)
    waiter = h.acquire_in_background()  # another such step cannot fit the second left
    assert h.window_done.wait(5)
    assert h.done() == [(1, pb.WINDOW_END_REASON_NO_FIT)]
    steps = [m.steps for m in h.sent if m.WhichOneof("body") == "steps"]
    assert len(steps) == 1 and steps[0].window_id == 1 and len(steps[0].steps) == 1
    h.writer.grant(2, time.monotonic_ns() + 10**9)
    waiter.join(5)
    assert not waiter.is_alive()


def test_a_task_that_sizes_its_steps_is_judged_by_its_smallest_step(tmp_path: Path) -> None:
    """min_step_s() replaces the measured steps: a task whose steps filled long windows still gets a short one."""
    h = Harness(tmp_path)
    h.gate.declared_step_s = lambda: 0.01  # one unit: 10 ms
    h.writer.grant(1, time.monotonic_ns() + 10**9)
    h.gate.acquire()
    start = time.monotonic_ns()
    h.gate.step_done(start, start + 2 * 10**9)  # its last step filled a long window: 2 s
    h.gate.acquire()  # still fits the second left, by its 10 ms unit
    assert h.done() == [] and h.gate.estimate_ns() == 10**7
    h.gate.declared_step_s = lambda: None  # no declaration: the measured 2 s decides again
    waiter = h.acquire_in_background()
    assert h.window_done.wait(5) and h.done() == [(1, pb.WINDOW_END_REASON_NO_FIT)]
    h.writer.grant(2, time.monotonic_ns() + 10**9)
    waiter.join(5)


def test_a_declared_smallest_step_that_fits_no_window_gets_a_probe_step_now_and_then(tmp_path: Path) -> None:
    """Only a step refreshes what a task declares: one slow first unit must not shut it out for good."""
    h = Harness(tmp_path)
    h.gate.declared_step_s = lambda: 5.0  # declared 5 s: fits no 1 s window
    waiter = h.acquire_in_background()
    for wid in range(1, PROBE_AFTER_WINDOWS):
        h.window_done.clear()
        h.writer.grant(wid, time.monotonic_ns() + 10**9)
        assert h.window_done.wait(5)
        assert h.done()[-1] == (wid, pb.WINDOW_END_REASON_NO_FIT)
        assert waiter.is_alive()
    h.writer.grant(PROBE_AFTER_WINDOWS, time.monotonic_ns() + 10**9)
    waiter.join(5)
    assert not waiter.is_alive()  # the probe: a step may run in this window


# -- a task that raised Unavailable ----------------------------------------------------------------


def wait_in_background(h: Harness, exc: Unavailable, available: Callable[[], bool]) -> tuple[threading.Thread, list]:
    """Run the gate's wait in a thread; the list gets what it raised (if anything)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            h.gate.wait_available(exc, available)
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert h.waiting.wait(5)
    return t, raised


def test_unavailable_gives_the_window_back_waits_with_backoff_and_ignores_grants_made_meanwhile(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    far = time.monotonic_ns() + 10**9
    h.writer.grant(1, far)
    h.gate.acquire()
    calls: list[float] = []

    def available() -> bool:
        calls.append(time.monotonic())
        if len(calls) == 1:
            h.writer.grant(2, far)  # granted before the agent read WorkerWaiting: stale for this worker
        return len(calls) == 4

    began = time.monotonic()
    h.gate.wait_available(Unavailable("db down", retry_s=0.01, max_retry_s=0.03), available)
    # The window went back first (same stream, in order), then the wait, then its end; no step counted.
    assert h.bodies() == ["steps", "window_done", "waiting", "waiting"]
    assert h.done() == [(1, pb.WINDOW_END_REASON_UNAVAILABLE)]
    assert h.waits() == [("db down", True), ("db down", False)]
    assert h.gate.total_steps == 0 and h.gate.estimator.samples() == [] and h.gate.remaining_s() == 0
    # Each try came at least its backoff after the one before: 0.01, 0.02, then 0.03 (the cap) twice.
    gaps = [b - a for a, b in itertools.pairwise([began, *calls])]
    assert [g >= d for g, d in zip(gaps, [0.01, 0.02, 0.03, 0.03], strict=True)] == [True] * 4, gaps
    assert h.gate._last_wid == 2  # window 2 is stale: never stepped in, never reported
    waiter = h.acquire_in_background()
    h.writer.grant(3, far)  # the agent's next grant, after it read WorkerWaiting(waiting=false)
    waiter.join(5)
    assert not waiter.is_alive() and h.gate._wid == 3
    assert h.done() == [(1, pb.WINDOW_END_REASON_UNAVAILABLE)]


@pytest.mark.parametrize("stop", [pb.CONTROL_ACTION_PAUSE, pb.CONTROL_ACTION_CANCEL, "lost"])
def test_pause_cancel_and_a_lost_agent_end_a_long_wait_at_once(tmp_path: Path, stop: object) -> None:
    h = Harness(tmp_path)
    h.writer.grant(1, time.monotonic_ns() + 10**9)
    h.gate.acquire()
    waiter, raised = wait_in_background(h, Unavailable("down", retry_s=60.0), lambda: False)
    began = time.monotonic()
    if stop == "lost":  # the reader thread saw the stream break
        h.shared.lost = True
        h.shared.wake()
    else:
        assert isinstance(stop, int)
        h.control(stop)
    waiter.join(5)
    assert not waiter.is_alive() and time.monotonic() - began < 5  # not the 60 s backoff
    assert len(raised) == 1 and isinstance(raised[0], TaskStop)
    assert h.done() == [(1, pb.WINDOW_END_REASON_UNAVAILABLE)]  # nothing more to close: it held no window


def test_a_checkpoint_asked_while_waiting_is_taken_and_the_wait_goes_on(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    waiter, raised = wait_in_background(h, Unavailable("down", retry_s=60.0), lambda: False)
    h.control(pb.CONTROL_ACTION_CHECKPOINT)
    assert h.checkpoints.wait(5)
    assert waiter.is_alive() and h.shared.control is Control.NONE
    h.control(pb.CONTROL_ACTION_PAUSE)
    waiter.join(5)
    assert not waiter.is_alive() and isinstance(raised[0], TaskStop)


def test_available_raising_counts_as_not_available_and_is_logged_once_per_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path)
    calls = itertools.count(1)

    def available() -> bool:
        if next(calls) < 4:
            raise ConnectionRefusedError("no answer")
        return True

    with caplog.at_level(logging.WARNING, logger="freeride.worker"):
        h.gate.wait_available(Unavailable("down", retry_s=0.001, max_retry_s=0.001), available)
    assert next(calls) == 5  # three raised, the fourth said yes
    assert [r.getMessage() for r in caplog.records] == ["available() raised; counted as not available"]
    assert h.waits() == [("down", True), ("down", False)]


def test_the_backoff_doubles_up_to_its_cap_and_never_spins() -> None:
    assert list(itertools.islice(backoff_delays(1.0, 30.0), 7)) == [1, 2, 4, 8, 16, 30, 30]
    assert list(itertools.islice(backoff_delays(5.0, 1.0), 2)) == [5, 5]  # a cap below the start: the start
    assert next(backoff_delays(0.0, 0.0)) == MIN_RETRY_S


@pytest.mark.parametrize(("raw", "gpu"), [("3", 3), ("0", 0), ("", -1), ("cuda", -1)])
def test_the_worker_reads_its_gpu_index_from_the_agents_environment(raw: str, gpu: int) -> None:
    assert gpu_index({"FREERIDE_GPU": raw}) == gpu  # -1: started by hand, not by an agent


def test_the_window_done_says_when_the_worker_saw_the_grant(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    waiter = h.acquire_in_background()
    granted = time.monotonic_ns()
    h.writer.grant(1, granted + 10**9)
    waiter.join(5)
    assert not waiter.is_alive()
    returned = time.monotonic_ns()
    h.gate.close(EndReason.REVOKED)
    (done,) = [m.window_done for m in h.sent if m.WhichOneof("body") == "window_done"]
    assert granted <= done.woke_ns <= returned  # the wait's end, or the read that found the grant


class _FarBeyond:
    """A worker whose first step (the left-out warm-up) took 2 s against 60 ms windows (as StepGate has it)."""

    WINDOW_NS = 60_000_000

    def __init__(self, tmp_path: Path) -> None:
        self.h = h = Harness(tmp_path)
        h.gate.estimator = StepEstimator(warmup_steps=1)  # as the worker has it
        h.writer.grant(1, time.monotonic_ns() + self.WINDOW_NS)
        h.gate.acquire()  # nothing known: the first step runs
        self.step(2_000_000_000)  # and takes 2 s (left out of the estimate: a warm-up)
        h.gate.close(EndReason.REVOKED)
        self.next_id = 2

    def step(self, duration_ns: int) -> None:
        start = time.monotonic_ns()
        self.h.gate.step_done(start, start + duration_ns)  # recorded, not slept

    def window(self) -> tuple[bool, int]:
        """Grant the next 60 ms window: whether a step ran in it, and the estimate the agent heard (0: none yet)."""
        h, wid = self.h, self.next_id
        self.next_id += 1
        h.window_done.clear()
        h.sent.clear()
        h.writer.grant(wid, time.monotonic_ns() + self.WINDOW_NS)
        stopped: list[BaseException] = []
        returned: list[bool] = []

        def acquire() -> None:
            try:
                h.gate.acquire()
                returned.append(True)
                h.window_done.set()  # (the one event waited for: a window given back, or a step may run)
            except TaskStop as exc:
                stopped.append(exc)

        waiter = threading.Thread(target=acquire, daemon=True)
        waiter.start()
        assert h.window_done.wait(5)
        if returned:  # acquire returned: a step may run
            waiter.join(5)
            h.gate.close(EndReason.REVOKED)
            return True, 0
        (done,) = [m.window_done for m in h.sent if m.WhichOneof("body") == "window_done"]
        assert done.window_id == wid
        h.shared.lost = True  # then end its wait for the next window
        h.shared.wake()
        waiter.join(5)
        h.shared.lost = False
        assert stopped  # it was still waiting: no step ran in that window
        return False, done.step_estimate_ns


def test_steps_far_longer_than_every_window_are_run_again_once_to_measure_them_then_never(tmp_path: Path) -> None:
    """Two-second steps, 60 ms windows (fix 20, fix 69): the first step is measured (nothing was known); no step runs
    on the left-out warm-up step until a whole series of windows it fit none (the agent's re-probe series: as many
    windows); then one, to measure it again; that sample, as long, keeps it out for good."""
    run = _FarBeyond(tmp_path)
    refused = [run.window() for _ in range(PROBE_AFTER_WINDOWS - 1)]
    assert refused == [(False, 2_000_000_000)] * (PROBE_AFTER_WINDOWS - 1)  # judged by the warm-up; the agent hears
    assert run.window() == (True, 0)  # the last window of the series: one step re-measures it
    run.step(2_000_000_000)  # as long: a lone sample, far beyond
    after = [run.window() for _ in range(3 * PROBE_AFTER_WINDOWS)]
    assert after == [(False, 2_000_000_000)] * (3 * PROBE_AFTER_WINDOWS)  # kept: never measured again


def test_a_first_step_slowed_by_lazy_set_up_does_not_keep_a_task_out_for_good(tmp_path: Path) -> None:
    """The warm-up step took 2 s (imports, a connection, a compile; a loaded machine), later steps take 5 ms: judged by
    the warm-up alone, the task would never step again (it starved, 2026-11-29: a pool task restarted under load
    never stepped again, so it never heard Redis was down). One series of windows later it is re-measured."""
    run = _FarBeyond(tmp_path)
    assert [run.window()[0] for _ in range(PROBE_AFTER_WINDOWS)] == [False] * (PROBE_AFTER_WINDOWS - 1) + [True]
    run.step(5_000_000)  # the re-measure: 5 ms
    assert [run.window()[0] for _ in range(4)] == [True] * 4  # it fits: it steps in every window


def test_a_closed_pipe_is_caught_even_when_a_file_the_task_opened_took_its_number(tmp_path: Path) -> None:
    """closerange in the task's constructor, then a file it opens gets the window pipe's number: an fstat alone
    would find that number open and miss it."""
    h = Harness(tmp_path)
    h.gate.know_pipes()
    h.gate.check_pipes(everyone=True)  # all there
    fd = h.gate.window.fd if h.gate.window is not None else -1
    other = os.open(tmp_path / "task-output.txt", os.O_WRONLY | os.O_CREAT)
    try:
        os.dup2(other, fd)  # closes the pipe's read end, and the number now names the task's file
        with pytest.raises(PlumbingError, match=rf"the worker's window pipe \(fd {fd}\) was closed: its number"):
            h.gate.check_pipes()
    finally:
        os.close(other)


def test_what_is_left_of_a_window_reads_the_word_again_so_a_revoke_ends_it_mid_step(tmp_path: Path) -> None:
    # A step that sizes itself unit by unit (StepBudget with window=context.remaining_s) asks between units: once
    # the agent has revoked the window (the bubble's END came early), nothing is left, whatever was predicted.
    h = Harness(tmp_path)
    far = time.monotonic_ns() + 10**9
    h.writer.grant(1, far)
    h.gate.acquire()
    assert h.gate.remaining_s() > 0.5
    h.writer.revoke(1, far)
    assert h.gate.remaining_s() == 0

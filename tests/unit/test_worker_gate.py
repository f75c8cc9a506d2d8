"""The worker's step gate, driven through a real window word and pipe (no agent, no gRPC)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from freeride.core.window import WindowReader, WindowWriter
from freeride.sdk._estimate import StepEstimator
from freeride.sdk.worker import _Gate, _Shared
from freeride.v1 import worker_pb2 as pb


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.writer = WindowWriter(tmp_path / "w.win")
        self.sent: list[pb.WorkerMessage] = []
        self.window_done = threading.Event()
        self.gate = _Gate(_Shared(), self._send, StepEstimator(), lambda force: None)
        self.gate.window = WindowReader(str(self.writer.path), self.writer.read_fd)

    def _send(self, msg: pb.WorkerMessage) -> None:
        self.sent.append(msg)
        if msg.WhichOneof("body") == "window_done":
            self.window_done.set()

    def done(self) -> list[tuple[int, int]]:
        return [(m.window_done.window_id, m.window_done.reason) for m in self.sent
                if m.WhichOneof("body") == "window_done"]

    def acquire_in_background(self) -> threading.Thread:
        t = threading.Thread(target=self.gate.acquire, daemon=True)
        t.start()
        return t


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

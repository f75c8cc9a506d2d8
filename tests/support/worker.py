"""The worker's step gate driven through a real window word and pipe, with no agent and no gRPC: what it sends is
kept as the messages freeride.worker.messages builds."""

from __future__ import annotations

import threading
from pathlib import Path

from freeride.core.window import WindowReader, WindowWriter
from freeride.v1 import worker_pb2 as pb
from freeride.worker.estimate import StepEstimator
from freeride.worker.gate import Shared, StepGate
from freeride.worker.messages import Outbox, control


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.writer = WindowWriter()
        self.sent: list[pb.WorkerMessage] = []
        self.window_done = threading.Event()
        self.waiting = threading.Event()  # set by WorkerWaiting(waiting=true)
        self.checkpoints = threading.Event()  # set by a forced checkpoint (one asked by the agent)
        self.shared = Shared()
        self.gate = StepGate(self.shared, Outbox(self._send), StepEstimator(), self._on_idle)
        self.gate.window = WindowReader(*self.writer.child_fds())

    def _send(self, msg: pb.WorkerMessage) -> None:
        self.sent.append(msg)
        if msg.WhichOneof("body") == "window_done":
            self.window_done.set()
        if msg.WhichOneof("body") == "waiting" and msg.waiting.waiting:
            self.waiting.set()

    def _on_idle(self, force: bool) -> None:
        if force:
            self.checkpoints.set()

    def bodies(self) -> list[str]:
        """The messages sent, by kind (an empty step report included: a closing window flushes one)."""
        return [str(m.WhichOneof("body")) for m in self.sent]

    def waits(self) -> list[tuple[str, bool]]:
        return [(m.waiting.reason, m.waiting.waiting) for m in self.sent if m.WhichOneof("body") == "waiting"]

    def control(self, action: pb.ControlAction) -> None:
        """What the reader thread does when the agent sends a control."""
        self.shared.control = control(action)
        self.shared.wake()

    def done(self) -> list[tuple[int, int]]:
        return [(m.window_done.window_id, m.window_done.reason) for m in self.sent
                if m.WhichOneof("body") == "window_done"]

    def acquire_in_background(self) -> threading.Thread:
        t = threading.Thread(target=self.gate.acquire, daemon=True)
        t.start()
        return t

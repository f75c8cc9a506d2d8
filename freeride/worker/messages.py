"""The worker's one protobuf meeting point (as freeride.agent.edge.convert is the agent's): its gRPC stream to
the agent, what it sends on it (`Outbox`) and what it reads from it (`Setup`, `Control`), translated to and from
freeride.worker.terms. Nothing else of the worker imports freeride.v1 (a contract in pyproject.toml says so).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import grpc

from freeride.v1 import worker_pb2 as pb
from freeride.v1 import worker_pb2_grpc
from freeride.worker.terms import Control, EndReason, Setup

_CONTROLS: dict[int, Control] = {pb.CONTROL_ACTION_UNSPECIFIED: Control.NONE, pb.CONTROL_ACTION_PAUSE: Control.PAUSE,
             pb.CONTROL_ACTION_CANCEL: Control.CANCEL, pb.CONTROL_ACTION_CHECKPOINT: Control.CHECKPOINT}
_REASONS: dict[EndReason, pb.WindowEndReason] = {
    EndReason.REVOKED: pb.WINDOW_END_REASON_REVOKED, EndReason.EXPIRED: pb.WINDOW_END_REASON_EXPIRED,
    EndReason.NO_FIT: pb.WINDOW_END_REASON_NO_FIT, EndReason.DONE: pb.WINDOW_END_REASON_DONE,
    EndReason.STOPPING: pb.WINDOW_END_REASON_STOPPING, EndReason.UNAVAILABLE: pb.WINDOW_END_REASON_UNAVAILABLE,
    EndReason.CHECKPOINT: pb.WINDOW_END_REASON_CHECKPOINT}


def control(action: int) -> Control:
    """A ControlAction as the worker's word (an unknown one, from a newer agent, asks nothing)."""
    return _CONTROLS.get(action, Control.NONE)


def setup(msg: pb.WorkerSetup) -> Setup:
    return Setup(task_ref=msg.task_ref, args=dict(msg.args), checkpoint_path=msg.checkpoint_path,
                 checkpoint_interval_s=msg.checkpoint_interval_s, mem_limit_bytes=msg.mem_limit_bytes)


def end_reason(reason: EndReason) -> pb.WindowEndReason:
    return _REASONS[reason]


class Outbox:
    """Each message the worker sends, built here and handed to `put` (the stream's queue, or a test's list)."""

    def __init__(self, put: Callable[[pb.WorkerMessage], None]) -> None:
        self._put = put

    def hello(self, task_id: str, instance: int, pid: int) -> None:
        self._put(pb.WorkerMessage(hello=pb.WorkerHello(task_id=task_id, instance=instance, pid=pid)))

    def ready(self, kind: str, resumed_steps: int, progress: Mapping[str, float]) -> None:
        self._put(pb.WorkerMessage(ready=pb.WorkerReady(kind=kind, resumed_steps=resumed_steps, progress=progress)))

    def steps(self, window_id: int, steps: Sequence[tuple[int, int]], progress: Mapping[str, float],
              peak_memory_bytes: int) -> None:
        """The steps run since the last report, each (start_ns, duration_ns)."""
        report = pb.StepReport(window_id=window_id, steps=[pb.Step(start_ns=s, duration_ns=d) for s, d in steps],
                               progress=progress, peak_memory_bytes=peak_memory_bytes)
        self._put(pb.WorkerMessage(steps=report))

    def window_done(self, window_id: int, reason: EndReason, idle_ns: int, step_estimate_ns: int,
                    woke_ns: int) -> None:
        done = pb.WindowDone(window_id=window_id, reason=end_reason(reason), idle_ns=idle_ns,
                             step_estimate_ns=step_estimate_ns, woke_ns=woke_ns)
        self._put(pb.WorkerMessage(window_done=done))

    def waiting(self, reason: str, waiting: bool) -> None:
        self._put(pb.WorkerMessage(waiting=pb.WorkerWaiting(reason=reason, waiting=waiting)))

    def idle_cpu(self, cpu_ns: int, idle_ns: int) -> None:
        self._put(pb.WorkerMessage(idle_cpu=pb.WorkerIdleCpu(cpu_ns=cpu_ns, idle_ns=idle_ns)))

    def checkpointing(self, active: bool) -> None:
        self._put(pb.WorkerMessage(checkpointing=pb.WorkerCheckpointing(active=active)))

    def checkpointed(self, steps: int, path: str, progress: Mapping[str, float]) -> None:
        self._put(pb.WorkerMessage(checkpointed=pb.Checkpointed(steps=steps, path=path, progress=progress)))

    def failed(self, reason: str, retryable: bool) -> None:
        self._put(pb.WorkerMessage(failed=pb.WorkerFailed(reason=reason, retryable=retryable)))

    def finished(self, progress: Mapping[str, float]) -> None:
        self._put(pb.WorkerMessage(finished=pb.WorkerFinished(progress=progress)))


class AgentLink:
    """The worker's one bidirectional stream to the agent: what is queued on `outbox` is sent in order; a reader
    thread hands each command on (`on_setup`, `on_control`) and calls `on_lost(broken)` once the stream ends
    (`broken`: with an error, the agent killed)."""

    def __init__(self, target: str) -> None:
        self.queue: queue.SimpleQueue[pb.WorkerMessage | None] = queue.SimpleQueue()
        self.outbox = Outbox(self.queue.put)
        self._channel = grpc.insecure_channel(target)
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        self._reader: threading.Thread | None = None

    def open(self, on_setup: Callable[[Setup], None], on_control: Callable[[Control], None],
             on_lost: Callable[[bool], None]) -> None:
        responses = self._stub.Attach(self._requests())
        self._reader = threading.Thread(target=self._read, args=(responses, on_setup, on_control, on_lost),
                                        name="freeride-agent-reader", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """End the stream (what was queued goes first) and the channel."""
        self.queue.put(None)
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._channel.close()

    def _requests(self) -> Iterator[pb.WorkerMessage]:
        while True:
            msg = self.queue.get()
            if msg is None:
                return
            yield msg

    @staticmethod
    def _read(responses: Iterator[pb.AgentCommand], on_setup: Callable[[Setup], None],
              on_control: Callable[[Control], None], on_lost: Callable[[bool], None]) -> None:
        broken = False
        try:
            for cmd in responses:
                which = cmd.WhichOneof("body")
                if which == "control":
                    on_control(control(cmd.control.action))
                elif which == "setup":
                    on_setup(setup(cmd.setup))
        except grpc.RpcError:  # the agent is gone (killed)
            broken = True
        on_lost(broken)

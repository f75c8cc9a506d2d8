"""The training-side reporter: bubble edges go to the agent without ever blocking training.

The training thread only stamps the time and appends to a bounded deque (a few microseconds);
a background thread owns the gRPC stream, reconnects with backoff, and drops events while no
agent is there. No exception from here can reach the training loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator

import grpc

from freeride.v1 import trainer_pb2, trainer_pb2_grpc

log = logging.getLogger(__name__)

START = trainer_pb2.BUBBLE_EDGE_START
END = trainer_pb2.BUBBLE_EDGE_END


class BubbleReporter:
    """Report bubble START/END for one training rank to the agent of its GPU.

    `start(slot)` / `end(slot)` cost microseconds and never raise; `bubble(slot)` is a context
    manager around a wait. Events are dropped (and counted) when the queue is full or no agent
    is connected: training never waits for freeride.
    """

    def __init__(
        self,
        target: str,
        rank: int = 0,
        stage: int = 0,
        max_queue: int = 65536,
        reconnect_min_s: float = 0.1,
        reconnect_max_s: float = 5.0,
    ) -> None:
        self.target = target
        self.rank = rank
        self.stage = stage
        self.iteration = 0
        self.sent = 0
        self.dropped = 0
        self._queue: deque[tuple[int, int, int, int, int, int, int]] = deque()
        self._max_queue = max_queue
        self._signal = threading.Lock()  # held while the sender has nothing to do
        self._signal.acquire()
        self._sleeping = False
        self._connected = threading.Event()
        self._live = False  # a plain bool: the hot path must not call Event.is_set()
        self._closed = False
        self._stopping = threading.Event()
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._warned = False
        self._generation = 0
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name=f"freeride-reporter-{rank}", daemon=True)
        self._thread.start()

    # -- training thread -----------------------------------------------------------------------------
    def set_iteration(self, iteration: int) -> None:
        """The training iteration that following edges belong to."""
        self.iteration = iteration

    def start(self, slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0) -> None:
        """The rank is about to wait: its GPU is idle from now."""
        now = time.monotonic_ns()
        try:
            if not self._live or len(self._queue) >= self._max_queue:
                self.dropped += 1
                return
            self._queue.append((START, slot, self.iteration, now, expected_duration_ns, free_memory_bytes, kind))
            if self._sleeping:  # wake the sender; a bare lock release never drops the GIL
                self._sleeping = False
                self._signal.release()
        except Exception:  # never into training (a racing second release lands here too)
            pass

    def end(self, slot: int, kind: int = 0) -> None:
        """The wait is over: the GPU is needed again from now."""
        now = time.monotonic_ns()
        try:
            if not self._live or len(self._queue) >= self._max_queue:
                self.dropped += 1
                return
            self._queue.append((END, slot, self.iteration, now, 0, 0, kind))
            if self._sleeping:
                self._sleeping = False
                self._signal.release()
        except Exception:
            pass

    @contextlib.contextmanager
    def bubble(self, slot: int, kind: int = 0) -> Iterator[None]:
        self.start(slot, kind)
        try:
            yield
        finally:
            self.end(slot, kind)

    # -- background thread ---------------------------------------------------------------------------
    def _release(self) -> None:
        with contextlib.suppress(RuntimeError):  # already released by another caller
            self._signal.release()

    def _wake(self) -> None:
        self._sleeping = False
        self._release()

    def wait_connected(self, timeout_s: float) -> bool:
        """For tests and start-up: block until the stream to the agent is live."""
        return self._connected.wait(timeout_s)

    def close(self, flush_timeout_s: float = 2.0) -> None:
        """Send what is queued, end the stream, stop the background thread."""
        self._closed = True
        self._stopping.set()
        self._wake()
        self._thread.join(timeout=flush_timeout_s)
        call = self._call
        if self._thread.is_alive() and call is not None:
            call.cancel()
            self._thread.join(timeout=5)

    def _requests(self, generation: int) -> Iterator[trainer_pb2.BubbleBatch]:
        q = self._queue
        while generation == self._generation:
            if not q:
                if self._closed:
                    return  # queue flushed: half-close the stream
                self._sleeping = True
                if not q:  # an append between the check and the flag would otherwise not wake us
                    self._signal.acquire()
                self._sleeping = False
            if not q or generation != self._generation:
                continue
            batch = trainer_pb2.BubbleBatch()
            add = batch.events.add
            while q:
                edge, slot, iteration, now, expected, free, kind = q.popleft()
                add(edge=edge, slot=slot, iteration=iteration, stage=self.stage, rank=self.rank, time_ns=now,
                    expected_duration_ns=expected, free_memory_bytes=free, kind=kind)
            self.sent += len(batch.events)
            yield batch

    def _run(self) -> None:
        delay = self._backoff[0]
        while not self._closed:
            try:
                with grpc.insecure_channel(self.target) as channel:
                    stub = trainer_pb2_grpc.BubbleServiceStub(channel)
                    call = stub.ReportBubbles(self._requests(self._generation))
                    self._call = call
                    for _welcome in call:
                        if not self._connected.is_set():
                            self._live = True  # before _connected: a waiter's next edge must not drop
                            self._connected.set()
                            self._warned = False
                            delay = self._backoff[0]
                            log.info("bubble reporter for rank %d connected to %s", self.rank, self.target)
            except grpc.RpcError as exc:
                if not self._closed and not self._warned:
                    log.warning(
                        "no freeride agent at %s (%s); training goes on, reporting resumes when it is back",
                        self.target,
                        exc.code().name if hasattr(exc, "code") else exc,
                    )
                    self._warned = True
            except Exception:
                log.exception("bubble reporter failed; retrying")
            finally:
                self._live = False
                self._connected.clear()
                self._generation += 1  # the old request generator wakes and returns
                self._wake()
                self._queue.clear()
                self._call = None
            if self._closed:
                break
            self._stopping.wait(delay)  # back off before reconnecting (background thread, not the control path)
            delay = min(delay * 2, self._backoff[1])

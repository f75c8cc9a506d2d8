"""The training-side reporter: bubble edges go to the agent without ever blocking training.

The training thread stamps the time and writes seven integers into a preallocated ring slot: no
allocation of a garbage-collected object (so no GC pause lands in the hook), no lock, no
system call unless the sender thread sleeps. A background thread owns the gRPC stream, batches
what is queued, reconnects with backoff, and drops edges while no agent is there. No exception
from here can reach the training loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import grpc

from freeride.core.auth import token_interceptor
from freeride.v1 import trainer_pb2, trainer_pb2_grpc

log = logging.getLogger(__name__)

START = trainer_pb2.BUBBLE_EDGE_START
END = trainer_pb2.BUBBLE_EDGE_END
_MAX_BATCH = 4096  # edges per message: far below the agent's message size limit


class BubbleReporter:
    """Report bubble START/END for one training rank to the agent of its GPU.

    `start(slot)` / `end(slot)` cost microseconds and never raise; `bubble(slot)` is a context
    manager around a wait. Edges are dropped (and counted in `dropped`) when the ring is full or
    no agent is connected: training never waits for freeride. One training thread per reporter
    (the ring has a single producer).
    """

    def __init__(
        self,
        target: str,
        rank: int = 0,
        stage: int = 0,
        max_queue: int = 16384,
        reconnect_min_s: float = 0.1,
        reconnect_max_s: float = 5.0,
        token: str | None = None,
    ) -> None:
        self.target = target
        self._token = token  # the agent's bearer token when it is reached over TCP
        self.rank = rank
        self.stage = stage
        self.iteration = 0
        self.sent = 0
        self.dropped = 0
        capacity = 1 << max(4, (max_queue - 1).bit_length())  # a power of two, so `& mask` indexes it
        self._ring = [[0] * 7 for _ in range(capacity)]
        self._mask = capacity - 1
        self._head = 0  # next slot the sender reads (sender thread only)
        self._tail = 0  # next slot the trainer writes (training thread only)
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

    # start() and end() are written out in full rather than sharing a helper: one more Python
    # call would cost about a microsecond of the 20 us budget.
    def start(self, slot: int, kind: int = 0, expected_duration_ns: int = 0, free_memory_bytes: int = 0) -> None:
        """The rank is about to wait: its GPU is idle from now."""
        now = time.monotonic_ns()
        try:
            tail = self._tail
            if not self._live or tail - self._head > self._mask:
                self.dropped += 1
                return
            rec = self._ring[tail & self._mask]
            rec[0] = START
            rec[1] = slot
            rec[2] = self.iteration
            rec[3] = now
            rec[4] = expected_duration_ns
            rec[5] = free_memory_bytes
            rec[6] = kind
            self._tail = tail + 1
            if self._sleeping:  # wake the sender; a bare lock release never drops the GIL
                self._sleeping = False
                self._signal.release()
        except Exception:  # never into training (a racing second release lands here too)
            pass

    def end(self, slot: int, kind: int = 0) -> None:
        """The wait is over: the GPU is needed again from now."""
        now = time.monotonic_ns()
        try:
            tail = self._tail
            if not self._live or tail - self._head > self._mask:
                self.dropped += 1
                return
            rec = self._ring[tail & self._mask]
            rec[0] = END
            rec[1] = slot
            rec[2] = self.iteration
            rec[3] = now
            rec[4] = 0
            rec[5] = 0
            rec[6] = kind
            self._tail = tail + 1
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

    @property
    def queued(self) -> int:
        """Edges written by the trainer and not yet sent."""
        return self._tail - self._head

    # -- background thread ---------------------------------------------------------------------------
    def _wake(self) -> None:
        self._sleeping = False
        with contextlib.suppress(RuntimeError):  # already released
            self._signal.release()

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
        ring, mask = self._ring, self._mask
        while generation == self._generation:
            if self._head == self._tail:
                if self._closed:
                    return  # queue flushed: half-close the stream
                self._sleeping = True
                if self._head == self._tail:  # a write between the check and the flag would not wake us
                    self._signal.acquire()
                self._sleeping = False
            if self._head == self._tail or generation != self._generation:
                continue
            batch = trainer_pb2.BubbleBatch()
            add = batch.events.add
            head, tail = self._head, min(self._tail, self._head + _MAX_BATCH)
            for i in range(head, tail):
                edge, slot, iteration, now, expected, free, kind = ring[i & mask]
                add(edge=edge, slot=slot, iteration=iteration, stage=self.stage, rank=self.rank, time_ns=now,
                    expected_duration_ns=expected, free_memory_bytes=free, kind=kind)
            self._head = tail
            self.sent += tail - head
            yield batch

    def _run(self) -> None:
        delay = self._backoff[0]
        while not self._closed:
            try:
                with grpc.insecure_channel(self.target) as raw:
                    channel = grpc.intercept_channel(raw, token_interceptor(self._token)) if self._token else raw
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
                code = exc.code() if hasattr(exc, "code") else None
                if not self._closed and not self._warned and code == grpc.StatusCode.UNAUTHENTICATED:
                    log.warning("the freeride agent at %s refused this rank's token (%s); training goes on "
                                "without reporting: set FREERIDE_TOKEN_FILE to the agent's token", self.target,
                                exc.details() if hasattr(exc, "details") else "")
                    self._warned = True
                elif not self._closed and not self._warned:
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
                self._head = self._tail  # edges of a dead stream are stale: drop them
                self._call = None
            if self._closed:
                break
            self._stopping.wait(delay)  # back off before reconnecting (background thread, not the control path)
            delay = min(delay * 2, self._backoff[1])

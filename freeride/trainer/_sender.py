"""The bubble reporter's background thread (freeride.trainer.reporter): the gRPC stream to the agent, its
hello and what comes back (the ring offered, a refusal), the queue of the gRPC road drained onto it, reconnection
with backoff and the ring of each new agent attached. A base class of BubbleReporter rather than an object of its
own: the training thread's hooks read the fields it sets (`_shm`, `_live`, the queue's indices) one attribute
lookup away, as before. Each field has one writer thread (see the reporter's constructor).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from freeride.core.paths import socket_access_problem
from freeride.core.ring import RingError, RingWriter
from freeride.trainer._ring import fetch_ring, park
from freeride.trainer.declaration import Pipeline

if TYPE_CHECKING:  # imported by the background thread (_run): ~0.1 s at a job's start, off the training thread
    import grpc

    from freeride.v1 import trainer_pb2

log = logging.getLogger("freeride.trainer.reporter")

_MAX_BATCH = 4096  # edges per message: far below the agent's message size limit


class Sender:
    """The background half of a BubbleReporter: the fields both halves share are declared here."""

    target: str
    rank: int
    stage: int
    pipeline: Pipeline
    refused: str
    refusals: int
    _token: str | None
    _want_ring: bool
    _shm: RingWriter | None
    _wake_fd: int
    _ring: list[list[int]]
    _mask: int
    _head: int
    _tail: int
    _signal: threading.Lock
    _sleeping: bool
    _sent: int
    _ring_written: int
    _ring_dropped: int
    _stale: int
    _road: threading.Condition
    _connected: threading.Event
    _live: bool
    _closed: bool
    _stopping: threading.Event
    _backoff: tuple[float, float]
    _warned: bool
    _generation: int
    _call: grpc.Future | None

    def _road_changed(self) -> None:
        with self._road:
            self._road.notify_all()

    def _wake(self) -> None:
        self._sleeping = False
        with contextlib.suppress(RuntimeError):  # already released
            self._signal.release()

    def wait_connected(self, timeout_s: float) -> bool:
        """For tests and start-up: block until the stream to the agent is live."""
        return self._connected.wait(timeout_s)

    def _requests(self, generation: int) -> Iterator[trainer_pb2.BubbleBatch]:
        from freeride.v1 import trainer_pb2  # (imported already: see _run)

        mask = self._mask
        pipe = self.pipeline
        yield trainer_pb2.BubbleBatch(
            hello=trainer_pb2.TrainerHello(rank=self.rank, stage=self.stage, shared_memory=self._want_ring,
                                        ring_records=self._mask + 1, schedule=pipe.schedule, stages=pipe.stages,
                                        microbatches=pipe.microbatches, stages_per_rank=pipe.stages_per_rank,
                                        pid=os.getpid())
        )
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
            ring = self._ring  # (made before the first edge could be queued: see _attach)
            head, tail = self._head, min(self._tail, self._head + _MAX_BATCH)
            for i in range(head, tail):
                edge, slot, iteration, now, expected, free, kind = ring[i & mask]
                add(edge=edge, slot=slot, iteration=iteration, stage=self.stage, rank=self.rank, time_ns=now,
                    expected_duration_ns=expected, free_memory_bytes=free, kind=kind & 0xFF)  # (no weight here)
            self._head = tail
            self._sent += tail - head
            yield batch

    def _attach(self, welcome: trainer_pb2.TrainerWelcome) -> None:
        """The agent answered the hello: take its ring if it offered one, else stay on gRPC."""
        if welcome.ring_socket:
            try:
                shm = fetch_ring(welcome.ring_socket, welcome.ring_key, self._wake_fd)
            except (OSError, RingError) as exc:
                log.warning("rank %d cannot use the agent's shared-memory ring (%s); reporting over gRPC",
                            self.rank, exc)
            else:
                self._wake_fd = shm.wake_fd
                self._shm = shm
                log.info("rank %d reports bubbles through the agent's shared-memory ring", self.rank)
                return
        if not self._ring:  # the gRPC road, for the first time: its queue (before `_live` lets the hooks in)
            self._ring = [[0] * 7 for _ in range(self._mask + 1)]

    def _detach(self) -> None:
        shm, self._shm = self._shm, None
        if shm is not None:
            self._ring_written += shm.written
            self._ring_dropped += shm.dropped
            park(self._wake_fd)

    def _no_socket(self) -> bool:
        """A unix-socket target with no file there: no agent, and nothing to load gRPC for yet."""
        target = self.target
        if not target.startswith("unix:") or target.startswith("unix-abstract:"):
            return False
        try:
            os.stat(target.removeprefix("unix:").removeprefix("//"))
        except FileNotFoundError:
            return True
        except OSError:
            return False  # (a directory kept out: gRPC's refusal says why)
        return False

    def _run(self) -> None:
        delay = self._backoff[0]
        while not self._closed and self._no_socket():  # the backoff below, before any connection was tried
            if not self._warned:
                log.warning("no freeride agent at %s (no socket); training goes on, reporting begins when it is there",
                            self.target)
                self._warned = True
            self._stopping.wait(delay)
            delay = min(delay * 2, self._backoff[1])
        if self._closed:
            return
        # Here, on the reporter's own thread, not in the constructor, and once there is an agent to talk to: a
        # training job's first step does not wait for gRPC and protobuf to load (~0.1 s of CPU).
        import grpc

        from freeride.core.auth import token_interceptor
        from freeride.v1 import trainer_pb2_grpc

        while not self._closed:
            try:
                with grpc.insecure_channel(self.target) as raw:
                    channel = grpc.intercept_channel(raw, token_interceptor(self._token)) if self._token else raw
                    stub = trainer_pb2_grpc.BubbleServiceStub(channel)
                    call = stub.ReportBubbles(self._requests(self._generation))
                    self._call = call
                    for welcome in call:
                        # Live once the agent answered the hello: before it, it may still refuse this rank.
                        if welcome.hello_answered and not self._connected.is_set():
                            self._attach(welcome)
                            self._live = True  # edges flow on gRPC unless a ring was attached
                            self._warned = False
                            self.refused = ""
                            delay = self._backoff[0]
                            log.info("bubble reporter for rank %d connected to %s", self.rank, self.target)
                            self._connected.set()  # after the attach: a waiter's first edge takes the ring
                            self._road_changed()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.ALREADY_EXISTS and not self._closed:
                    detail = exc.details() if hasattr(exc, "details") else ""
                    if not self._warned:
                        log.warning("the freeride agent at %s refused rank %d (%s); training goes on without its "
                                    "bubbles harvested; the reporter tries again in the background", self.target,
                                    self.rank, detail)
                        self._warned = True
                    with self._road:
                        self.refused = detail
                        self.refusals += 1
                        self._road.notify_all()
                elif not self._closed and not self._warned and code == grpc.StatusCode.UNAUTHENTICATED:
                    log.warning("the freeride agent at %s refused this rank's token (%s); training goes on "
                                "without reporting: set FREERIDE_TOKEN_FILE to the agent's token", self.target,
                                exc.details() if hasattr(exc, "details") else "")
                    self._warned = True
                elif not self._closed and not self._warned:
                    denied = socket_access_problem(self.target)  # a group to join, not an agent to start
                    if denied:
                        log.warning("%s; training goes on without reporting bubbles (retrying in the background)",
                                    denied)
                    else:
                        log.warning(
                            "no freeride agent at %s (%s); training goes on, reporting resumes when it is back",
                            self.target,
                            exc.code().name if hasattr(exc, "code") else exc,
                        )
                    self._warned = True
            except Exception:
                log.exception("bubble reporter failed; retrying")
            finally:
                self._live = False  # first: an edge from now on is dropped and counted, not queued
                self._detach()  # the ring died with its agent: edges wait for the next stream's ring
                self._connected.clear()
                self._generation += 1  # the old request generator wakes and returns
                self._wake()
                self._stale += self._tail - self._head  # edges of a dead stream are stale: dropped, counted
                self._head = self._tail
                self._call = None
                self._road_changed()
            if self._closed:
                break
            self._stopping.wait(delay)  # back off before reconnecting (background thread, not the control path)
            delay = min(delay * 2, self._backoff[1])

"""One connected trainer: its ReportBubbles call from the first welcome to the close.

A `TrainerLink` owns, for one training rank's stream:
  the hello      the rank claim (a second stream of a held rank is refused with ALREADY_EXISTS), the
                 declaration kept for `freeride profile`, and the welcome that answers it;
  the road       a rank on this host that asked for `shared_memory` is offered a ring
                 (freeride.agent.edge.ring); taken within the handshake timeout, its edges arrive through
                 it and the stream only carries liveness; not taken, they stay on gRPC;
  its counters   edges, rejections (out of bounds, another rank's, torn ring records) and the trainer's
                 drops, in its `TrainerStream` record, which `freeride stats` and /metrics report;
  the close      what the ring still holds is read, then each rank it reported is gone and the record
                 is dropped; no await in it (a dead peer's call is cancelled, and a cancelled await
                 would end the clean-up half way).
The link reports all of it to the GPU's trainers (freeride.agent.engine.trainers), and only to them: while
the ring is attached they hold it as a `RingPort` to read it late (a Stats call) and to make it listen or be
quiet (Trainers.listening).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from freeride.agent.config import AccessConfig
from freeride.agent.domain.trainers import SHM, TrainerStream
from freeride.agent.edge.bubble_checks import edge_ok, edge_problem, take_records
from freeride.agent.edge.convert import declaration_from_pb, edge_from_pb
from freeride.agent.edge.ring import HANDSHAKE_TIMEOUT_S, RingChannel
from freeride.agent.edge.wire import Malformed, reject
from freeride.agent.engine.trainers import Trainers
from freeride.core.ring import Record, ring_records
from freeride.core.version import __version__
from freeride.v1 import trainer_pb2

log = logging.getLogger("freeride.agent")


class TrainerLink:
    """One trainer's stream (a ReportBubbles call), and its ring if it takes one."""

    def __init__(self, trainers: Trainers, gpu: int, access: AccessConfig, context: grpc.aio.ServicerContext,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        """`access`: the agent's socket and road settings (where a ring's files go, their mode and group)."""
        self._trainers = trainers
        self._gpu = gpu
        self._access = access
        self._context = context
        self._handshake_timeout_s = handshake_timeout_s
        self.stream = TrainerStream(context.peer())
        self._ranks: set[int] = set()  # every rank it reported: each is gone when it closes
        self._ring: RingChannel | None = None
        self._read_ns = 0  # when the ring's records were last delivered (a quiet agent reads late: bubble_checks)
        self._refused = ""

    async def serve(self) -> None:
        """Welcome the trainer, read its messages until it ends the stream, then close."""
        context = self._context
        await context.write(trainer_pb2.TrainerWelcome(gpu=self._gpu, agent_version=__version__))
        self._trainers.opened(self.stream)
        log.debug("trainer stream opened (%s)", self.stream.peer)
        try:
            while True:
                batch = await context.read()
                if batch is grpc.aio.EOF:
                    break
                if isinstance(batch, Malformed):
                    await reject(context, batch)
                if batch.HasField("hello") and not self.stream.hello:
                    await self._hello(batch.hello)
                self._edges(batch.events)
        finally:
            self._close()

    # -- the hello ---------------------------------------------------------------------------------
    async def _hello(self, hello: trainer_pb2.TrainerHello) -> None:
        trainers, stream = self._trainers, self.stream
        stream.rank, stream.stage, stream.pid, stream.hello = hello.rank, hello.stage, hello.pid, True
        self._refused = trainers.hello(stream)
        if self._refused:  # logged once by the claims; the trainer's reporter says it on its side
            await self._context.abort(grpc.StatusCode.ALREADY_EXISTS, self._refused)
        trainers.declared(declaration_from_pb(hello))
        log.info("trainer %s connected", stream.name)
        self._ranks.add(stream.rank)
        ring = self._ring = self._ring_for(hello)
        await self._context.write(trainer_pb2.TrainerWelcome(
            gpu=self._gpu, agent_version=__version__, hello_answered=True,
            ring_socket=str(ring.socket_path) if ring else "", ring_key=ring.key if ring else b"",
        ))
        if ring is not None:
            ring.offer(self._fetched, self._timed_out, self._handshake_timeout_s)

    # -- the road ----------------------------------------------------------------------------------
    def _ring_for(self, hello: trainer_pb2.TrainerHello) -> RingChannel | None:
        """A ring for a local trainer that asked for one, unless this agent keeps edges on gRPC."""
        access = self._access
        if not hello.shared_memory or access.bubble_path == "grpc" or not self.stream.peer.startswith("unix:"):
            return None
        try:
            return RingChannel(access.socket_path.parent, self._gpu, access.socket_mode_bits(), access.socket_gid(),
                               ring_records(hello.ring_records))
        except OSError as exc:
            log.warning("trainer %s: no shared-memory ring (%s); its edges stay on gRPC", self.stream.name, exc)
            return None

    def _timed_out(self) -> None:
        assert self._ring is not None
        log.warning("trainer %s did not fetch its bubble ring from %s; its edges stay on gRPC",
                    self.stream.name, self._ring.socket_path)

    def _fetched(self) -> None:
        ring, stream, trainers = self._ring, self.stream, self._trainers
        assert ring is not None
        stream.path = SHM
        ring.quiet = not trainers.listening  # quiet while no edge can lead to a grant (Trainers.listening)
        self._read_ns = trainers.clock()
        ring.start(self._deliver)
        trainers.moved(stream, ring)
        log.info("trainer %s reports through shared memory (%s)", stream.name, ring.path.name)

    def _deliver(self, records: list[Record]) -> None:
        """A batch read from the ring: checked as the stream's messages are, and counted."""
        assert self._ring is not None
        trainers, stream, reader = self._trainers, self.stream, self._ring.reader
        now = trainers.clock()
        rejected = take_records(stream, records, now, trainers.edge, self._read_ns)
        self._read_ns = now
        torn = reader.corrupt + reader.lost - stream.torn
        if torn:
            stream.torn += torn
            stream.reject(f"{torn} torn or scribbled ring record(s)", torn)
        trainers.rejected(rejected + torn)
        stream.dropped = reader.dropped_by_writer

    def _edges(self, events: Any) -> None:
        """The edges that came on the stream itself (before a ring, or without one)."""
        trainers, stream = self._trainers, self.stream
        now = trainers.clock()
        for ev in events:
            problem = (edge_problem(ev, now) if not edge_ok(ev, now) else
                       f"an edge of rank {ev.rank} on the stream of rank {stream.rank}"
                       if stream.hello and ev.rank != stream.rank else "")
            if problem:
                trainers.rejected()
                stream.reject(problem)
                continue
            self._ranks.add(ev.rank)
            stream.edges += 1
            trainers.edge(edge_from_pb(ev))

    # -- the close ---------------------------------------------------------------------------------
    def _close(self) -> None:
        trainers = self._trainers
        trainers.ring_closing(self.stream)  # no reads from the agent into a ring being closed
        try:
            if self._ring is not None:
                self._ring.close()  # takes the edges written before the trainer went
        finally:
            for rank in self._ranks:
                trainers.gone(rank)
            trainers.closed(self.stream)
            if not self._refused:
                log.info("trainer %s disconnected", self.stream.name)

"""Trainer streams: one record per connected training rank, and the edges taken from its ring.

The gRPC servicer (freeride.agent.service) opens a `TrainerStream` per ReportBubbles call; if
the trainer is on this host it also gets a ring (freeride.agent.ring) whose records come here
to be checked exactly as the stream's messages are (freeride.agent.limits) before they become
`Edge`s. `path` says which road the edges take, for `freeride stats` and /metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from freeride.agent.events import Edge
from freeride.agent.limits import record_ok, record_problem
from freeride.core.ring import EDGE_START, Record
from freeride.v1 import trainer_pb2

log = logging.getLogger("freeride.agent")

_BETWEEN_STEPS = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS
GRPC = "grpc"
SHM = "shm"


@dataclass(slots=True)
class TrainerStream:
    peer: str
    rank: int = 0
    stage: int = 0
    path: str = GRPC
    edges: int = 0
    rejected: int = 0  # out of bounds, torn or scribbled
    dropped: int = 0  # dropped by the trainer: its ring was full
    torn: int = 0  # ring records that failed their check word (included in `rejected`)
    warned: bool = False  # the first rejection is logged, the rest only counted
    # Takes what the trainer has written and the agent not yet read (its ring's records), so that an
    # answer to Stats is current as of the call; None on the gRPC road, where nothing waits unread here.
    take: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    # Asks the ring for a wake-up per edge (True) or lets it be quiet (False); None on the gRPC road.
    listen: Callable[[bool], None] | None = field(default=None, compare=False, repr=False)

    def reject(self, problem: str, count: int = 1) -> None:
        self.rejected += count
        if not self.warned:  # once per stream: a broken trainer must not flood the log
            self.warned = True
            log.warning("trainer %s (rank %d): bubble edge rejected: %s; further rejections on this stream are only "
                        "counted (rejected_events)", self.peer, self.rank, problem)


def take_records(
    stream: TrainerStream, records: list[Record], now_ns: int, on_edge: Callable[[Edge], None]
) -> int:
    """Check ring records and pass on the good ones as edges; returns how many were rejected."""
    rejected = 0
    rank = stream.rank
    for r in records:
        if not record_ok(r, now_ns):
            rejected += 1
            stream.reject(record_problem(r, now_ns))
            continue
        stream.edges += 1
        on_edge(Edge(r.edge == EDGE_START, r.kind != _BETWEEN_STEPS, rank, r.slot, r.iteration, r.time_ns,
                     r.expected_duration_ns, r.free_memory_bytes))
    return rejected

"""Checks of the bubble edges trainers send: values outside these bounds are mistakes or attacks, never bubbles.

Checked at the gRPC edge, on the message itself, and on each record of a shared-memory ring (whose
words are raw int64s: the slot and iteration are bounded here too); a ring's good records become
`Edge`s here (`take_records`). A bad edge is counted and dropped (a training stream is never ended
for one bad edge). Task specs are bounded in
freeride.agent.engine.validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from freeride.agent.domain.events import Edge
from freeride.agent.domain.trainers import TrainerStream
from freeride.core.ring import EDGE_START, MAX_STANDS_FOR, Record
from freeride.v1 import trainer_pb2

# Bubble edges are stamped with this host's CLOCK_MONOTONIC just before they are sent: one from the
# future, or from long ago, is not a bubble of this training run.
MAX_EDGE_AGE_NS = 60 * 10**9
MAX_EDGE_LEAD_NS = 1 * 10**9
MAX_EXPECTED_BUBBLE_NS = 600 * 10**9  # a "bubble" of more than ten minutes is not a pipeline bubble
MAX_FREE_MEMORY_BYTES = 1 << 50
MAX_SLOT = (1 << 32) - 1  # the gRPC message's uint32
EDGES = frozenset({trainer_pb2.BUBBLE_EDGE_START, trainer_pb2.BUBBLE_EDGE_END})
KINDS = frozenset(trainer_pb2.BubbleKind.values())
_BETWEEN_STEPS = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS


class EdgeFields(Protocol):
    """What an edge carries, from a gRPC message (trainer_pb2.BubbleEvent) or a ring record (core.ring.Record)."""

    @property
    def edge(self) -> int: ...
    @property
    def time_ns(self) -> int: ...
    @property
    def expected_duration_ns(self) -> int: ...
    @property
    def free_memory_bytes(self) -> int: ...
    @property
    def kind(self) -> int: ...


def edge_ok(ev: EdgeFields, now_ns: int, max_age_ns: int = MAX_EDGE_AGE_NS) -> bool:
    """The per-edge fast check (hot path: plain comparisons only)."""
    age = now_ns - ev.time_ns
    return (
        ev.edge in EDGES
        and -MAX_EDGE_LEAD_NS <= age <= max_age_ns
        and 0 <= ev.expected_duration_ns <= MAX_EXPECTED_BUBBLE_NS
        and 0 <= ev.free_memory_bytes <= MAX_FREE_MEMORY_BYTES
        and ev.kind in KINDS
    )


def edge_problem(ev: EdgeFields, now_ns: int, max_age_ns: int = MAX_EDGE_AGE_NS) -> str:
    """Why `edge_ok` refused `ev`, for the log (slow path, bad edges only)."""
    age = now_ns - ev.time_ns
    if ev.edge not in EDGES:
        return f"unknown edge {ev.edge}"
    if age > max_age_ns:
        return f"time_ns is {age / 1e9:.1f} s in the past (limit {max_age_ns / 1e9:.0f} s)"
    if age < -MAX_EDGE_LEAD_NS:
        return f"time_ns is {-age / 1e9:.1f} s in the future: stamp edges with time.monotonic_ns() on this host"
    if not 0 <= ev.expected_duration_ns <= MAX_EXPECTED_BUBBLE_NS:
        return f"expected_duration_ns {ev.expected_duration_ns} is outside 0..{MAX_EXPECTED_BUBBLE_NS}"
    if not 0 <= ev.free_memory_bytes <= MAX_FREE_MEMORY_BYTES:
        return f"free_memory_bytes {ev.free_memory_bytes} is outside 0..{MAX_FREE_MEMORY_BYTES}"
    return f"unknown bubble kind {ev.kind}"


def record_ok(r: Record, now_ns: int, max_age_ns: int = MAX_EDGE_AGE_NS) -> bool:
    """`edge_ok` for a ring record, whose raw words also need the slot and iteration bounded."""
    return (edge_ok(r, now_ns, max_age_ns) and 0 <= r.slot <= MAX_SLOT and r.iteration >= 0
            and r.stands_for <= MAX_STANDS_FOR)


def record_problem(r: Record, now_ns: int, max_age_ns: int = MAX_EDGE_AGE_NS) -> str:
    if not 0 <= r.slot <= MAX_SLOT:
        return f"slot {r.slot} is outside 0..{MAX_SLOT}"
    if r.iteration < 0:
        return f"iteration {r.iteration} is negative"
    if r.stands_for > MAX_STANDS_FOR:
        return f"stands for {r.stands_for} iterations (limit {MAX_STANDS_FOR})"
    return edge_problem(r, now_ns, max_age_ns)


def take_records(
    stream: TrainerStream, records: list[Record], now_ns: int, on_edge: Callable[[Edge], None], read_ns: int = 0
) -> int:
    """Check ring records and pass on the good ones as edges; returns how many were rejected.

    `read_ns`: when the agent last read this ring (0: now). A quiet agent reads late on purpose, so a record is
    judged by its age at that read, not at this one: one written an hour ago into a ring nobody read since is a
    bubble of this run; one stamped long before the last read is not."""
    rejected = 0
    rank = stream.rank
    max_age = MAX_EDGE_AGE_NS + max(0, now_ns - read_ns) if read_ns else MAX_EDGE_AGE_NS
    for r in records:
        if not record_ok(r, now_ns, max_age):
            rejected += 1
            stream.reject(record_problem(r, now_ns, max_age))
            continue
        stream.edges += 1
        on_edge(Edge(r.edge == EDGE_START, r.kind != _BETWEEN_STEPS, rank, r.slot, r.iteration, r.time_ns,
                     r.expected_duration_ns, r.free_memory_bytes, r.kind, r.stands_for))
    return rejected

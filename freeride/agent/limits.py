"""Bounds on what callers may send: values outside them are mistakes or attacks, never workloads.

Checked at the gRPC edge. A bad bubble edge is counted and dropped (a training stream is never
ended for one bad edge); a bad task spec is refused with INVALID_ARGUMENT and a message.
"""

from __future__ import annotations

from freeride.agent.model import TaskSpec
from freeride.errors import InvalidSpecError
from freeride.v1 import trainer_pb2

# Bubble edges are stamped with this host's CLOCK_MONOTONIC just before they are sent: one from the
# future, or from long ago, is not a bubble of this training run.
MAX_EDGE_AGE_NS = 60 * 10**9
MAX_EDGE_LEAD_NS = 1 * 10**9
MAX_EXPECTED_BUBBLE_NS = 600 * 10**9  # a "bubble" of more than ten minutes is not a pipeline bubble
MAX_FREE_MEMORY_BYTES = 1 << 50
EDGES = frozenset({trainer_pb2.BUBBLE_EDGE_START, trainer_pb2.BUBBLE_EDGE_END})
KINDS = frozenset(trainer_pb2.BubbleKind.values())

MAX_REF_CHARS = 4096
MAX_ARGS = 256
MAX_ARG_KEY_CHARS = 128
MAX_ARG_VALUE_CHARS = 64 * 1024


def edge_ok(ev: trainer_pb2.BubbleEvent, now_ns: int) -> bool:
    """The per-edge fast check (hot path: plain comparisons only)."""
    age = now_ns - ev.time_ns
    return (
        ev.edge in EDGES
        and -MAX_EDGE_LEAD_NS <= age <= MAX_EDGE_AGE_NS
        and 0 <= ev.expected_duration_ns <= MAX_EXPECTED_BUBBLE_NS
        and 0 <= ev.free_memory_bytes <= MAX_FREE_MEMORY_BYTES
        and ev.kind in KINDS
    )


def edge_problem(ev: trainer_pb2.BubbleEvent, now_ns: int) -> str:
    """Why `edge_ok` refused `ev`, for the log (slow path, bad edges only)."""
    age = now_ns - ev.time_ns
    if ev.edge not in EDGES:
        return f"unknown edge {ev.edge}"
    if age > MAX_EDGE_AGE_NS:
        return f"time_ns is {age / 1e9:.1f} s in the past (limit {MAX_EDGE_AGE_NS / 1e9:.0f} s)"
    if age < -MAX_EDGE_LEAD_NS:
        return f"time_ns is {-age / 1e9:.1f} s in the future: stamp edges with time.monotonic_ns() on this host"
    if not 0 <= ev.expected_duration_ns <= MAX_EXPECTED_BUBBLE_NS:
        return f"expected_duration_ns {ev.expected_duration_ns} is outside 0..{MAX_EXPECTED_BUBBLE_NS}"
    if not 0 <= ev.free_memory_bytes <= MAX_FREE_MEMORY_BYTES:
        return f"free_memory_bytes {ev.free_memory_bytes} is outside 0..{MAX_FREE_MEMORY_BYTES}"
    return f"unknown bubble kind {ev.kind}"


def check_spec(spec: TaskSpec, device_total_bytes: int | None) -> None:
    """Bounds beyond the basic ones in the agent core: sizes, and a cap the device can hold at all."""
    if len(spec.ref) > MAX_REF_CHARS:
        raise InvalidSpecError(f"the task reference is longer than {MAX_REF_CHARS} characters")
    if len(spec.args) > MAX_ARGS:
        raise InvalidSpecError(f"{len(spec.args)} task arguments; at most {MAX_ARGS} are accepted")
    for key, value in spec.args.items():
        if len(key) > MAX_ARG_KEY_CHARS:
            raise InvalidSpecError(f"argument name {key[:32]!r}... is longer than {MAX_ARG_KEY_CHARS} characters")
        if len(value) > MAX_ARG_VALUE_CHARS:
            raise InvalidSpecError(
                f"argument {key!r} is {len(value)} characters long; at most {MAX_ARG_VALUE_CHARS} "
                "(pass a file path for bulk data)"
            )
    if device_total_bytes and spec.mem_limit_bytes > device_total_bytes:
        raise InvalidSpecError(
            f"memory cap {spec.mem_limit_bytes / 2**30:.1f} GiB is more than the device has "
            f"({device_total_bytes / 2**30:.1f} GiB); lower --mem"
        )

"""Bubble traces: simulate a 1F1B or GPipe schedule, or read a recorded trace from a file.

A trace is, per stage, a list of iterations; each iteration a list of segments in time order:
compute (the stage is busy) or a bubble (the stage waits), with its slot and kind.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from freeride.tooling.whatif import Bubble
from freeride.v1 import trainer_pb2

FILL, WARMUP, DRAIN, COOLDOWN = (
    trainer_pb2.BUBBLE_KIND_FILL,
    trainer_pb2.BUBBLE_KIND_WARMUP,
    trainer_pb2.BUBBLE_KIND_DRAIN,
    trainer_pb2.BUBBLE_KIND_COOLDOWN,
)


@dataclass(frozen=True)
class Segment:
    duration_s: float
    bubble: bool
    slot: int = 0
    kind: int = 0


def _order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - 1 - s, m)
    ops = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while b < m:
        if f < m:
            ops.append(("F", f))
            f += 1
        ops.append(("B", b))
        b += 1
    return ops


def simulate_iteration(
    schedule: str, p: int, m: int, f_s: float, b_s: float, jitter: float, rng: random.Random
) -> list[list[Segment]]:
    """One iteration of every stage: list scheduling of the schedule's op order with dependencies."""
    schedule = schedule.lower()
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"unknown schedule {schedule!r}: use 1F1B or GPipe")
    orders = [_order(schedule, p, m, s) for s in range(p)]
    dur = {
        (op, s, i): (f_s if op == "F" else b_s) * (1 + rng.uniform(-jitter, jitter))
        for s in range(p) for op, i in orders[s]
    }
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                op, i = orders[s][pos[s]]
                dep = ("F", s - 1, i) if op == "F" and s > 0 else ("B", s + 1, i) if op == "B" and s < p - 1 else None
                if op == "B" and s == p - 1:
                    dep = ("F", s, i)
                if dep is not None and dep not in end:
                    break
                t0 = max(free[s], end[dep] if dep is not None else 0.0)
                start[(op, s, i)] = t0
                end[(op, s, i)] = free[s] = t0 + dur[(op, s, i)]
                pos[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")  # cannot happen for 1F1B/GPipe orders
    total = max(free)
    stages = []
    for s in range(p):
        # Every receive wait is a slot, as in a real trainer, even when it is (nearly) zero: that
        # keeps slot numbers stable across iterations when jitter opens or closes small gaps.
        segs: list[Segment] = []
        t = 0.0
        slot = 0
        seen_b = False
        for op, i in orders[s]:
            key = (op, s, i)
            receives = (op == "F" and s > 0) or (op == "B" and s < p - 1)
            if receives:
                kind = FILL if slot == 0 and op == "F" else COOLDOWN if seen_b and op == "B" else WARMUP
                segs.append(Segment(max(0.0, start[key] - t), True, slot, kind))
                slot += 1
            elif start[key] - t > 0:
                segs.append(Segment(start[key] - t, False))  # waits on its own earlier op: not idle here
            segs.append(Segment(dur[key], False))
            seen_b |= op == "B"
            t = end[key]
        segs.append(Segment(max(0.0, total - t), True, slot, DRAIN))
        stages.append(segs)
    return stages


def generate(
    schedule: str, p: int, m: int, f_ms: float, b_ms: float, jitter: float, iterations: int, seed: int = 0
) -> list[list[list[Segment]]]:
    """trace[stage][iteration] -> segments."""
    rng = random.Random(seed)
    per_iter = [simulate_iteration(schedule, p, m, f_ms / 1e3, b_ms / 1e3, jitter, rng) for _ in range(iterations)]
    return [[it[s] for it in per_iter] for s in range(p)]


def save(path: Path, stage_trace: list[list[Segment]]) -> None:
    path.write_text(json.dumps([[asdict(seg) for seg in it] for it in stage_trace]))


def load(path: Path) -> list[list[Segment]]:
    """A recorded trace for one stage: a JSON list of iterations, each a list of segments."""
    try:
        raw = json.loads(path.read_text())
        return [[Segment(**seg) for seg in it] for it in raw]
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from None


def bubbles_of(stage_trace: list[list[Segment]], start_ns: int = 0) -> list[Bubble]:
    """A stage's trace laid out in time from `start_ns`: its bubbles, as `freeride.tooling.whatif` replays them."""
    out = []
    t = start_ns
    for iteration, segments in enumerate(stage_trace):
        for seg in segments:
            length = int(seg.duration_s * 1e9)
            if seg.bubble:
                out.append(Bubble(seg.slot, iteration, t, t + length, seg.kind))
            t += length
    return out

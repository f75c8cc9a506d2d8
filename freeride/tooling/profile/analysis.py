"""The bubble profile of a job, from a recording: per stage and slot, the theory, and the what-if. Pure.

Per rank (a stage of the pipeline, or several with interleaved schedules): its iteration length
(the median period of its first slot), and per slot the count, mean, p50 and p95 length and share
of the iteration, with the slot's kind as the trainer classified the wait (fill, warm-up -> first
backward, drain gaps, drain) where the schedule is 1F1B or GPipe, else the wait's position. Beside
the measured bubble fraction, the theory for the schedule the trainer declared. The what-if replays
each rank's bubbles through the agent's scheduler (freeride.tooling.whatif) for each step size.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from freeride.core.stats import percentile
from freeride.tooling import whatif
from freeride.tooling.profile.recording import Declaration, RecordedBubble, Recording
from freeride.v1 import trainer_pb2

KINDS: dict[int, str] = {
    trainer_pb2.BUBBLE_KIND_FILL: "fill",
    trainer_pb2.BUBBLE_KIND_WARMUP: "warm-up→first backward",
    trainer_pb2.BUBBLE_KIND_COOLDOWN: "drain gap",
    trainer_pb2.BUBBLE_KIND_DRAIN: "drain",
    trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS: "between steps",
}
_BETWEEN_STEPS = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS
_ONE_CHUNK = {"1f1b", "gpipe"}  # schedules whose waits have the four kinds of DESIGN.md section 1
_INTERLEAVED = {"interleaved1f1b", "loopedbfs"}
_ZERO_BUBBLE = {"interleavedzerobubble", "zbvzerobubble", "dualpipev"}


@dataclass(frozen=True)
class Theory:
    schedule: str  # as declared ("": none declared)
    p: int
    m: int
    v: int
    fraction: float | None  # the schedule's idle share of an iteration; None: no formula applies
    formula: str  # the formula used, or why none applies


@dataclass(frozen=True)
class SlotProfile:
    slot: int
    kind: str
    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    share: float  # mean length / iteration length


@dataclass(frozen=True)
class WhatIf:
    step: str  # "5ms", or "task <id>"
    step_ms: float  # the (median) step length
    share: float  # of this rank's idle time the task would harvest (after the agent learned the slots)
    overrun_steps: int


@dataclass(frozen=True)
class StageProfile:
    gpu: int
    rank: int
    stage: int
    iterations: int
    iteration_ms: float
    bubble_fraction: float  # harvestable bubble time / iteration time, measured
    theory: Theory
    slots: list[SlotProfile]
    whatif: list[WhatIf] = field(default_factory=list)
    whatif_note: str = ""  # why there is no what-if ("": there is one)


def theory(schedule: str, p: int, m: int, v: int = 1) -> Theory:
    """The idle share of an iteration the declared schedule implies (F and B per micro-batch cancel out)."""
    name = schedule.lower()
    if not schedule or p <= 0 or m <= 0:
        return Theory(schedule, p, m, v, None, "the trainer declared no schedule, p and m")
    if name in _ONE_CHUNK:
        return Theory(schedule, p, m, v, (p - 1) / (m + p - 1), "(p-1)/(m+p-1)")
    if name in _INTERLEAVED:
        return Theory(schedule, p, m, v, (p - 1) / (v * m + p - 1), "(p-1)/(v·m+p-1), v model chunks per rank")
    if name in _ZERO_BUBBLE:
        return Theory(schedule, p, m, v, None, "none applies: zero-bubble schedules fill the warm-up and drain with "
                                               "weight-gradient work; what is left depends on F, B and W")
    return Theory(schedule, p, m, v, None, f"none known for {schedule}")


def slot_kind(schedule: str, kind: int, position: int) -> str:
    """The slot's kind where the schedule is known (1F1B, GPipe), else the wait's position in the iteration."""
    if kind == _BETWEEN_STEPS:
        return KINDS[kind]
    if schedule.lower() in _ONE_CHUNK and kind in KINDS:
        return KINDS[kind]
    return f"wait {position + 1}"


def iteration_ns(bubbles: Sequence[RecordedBubble]) -> float:
    """The median time between the same slot's starts in consecutive recorded iterations (the first slot seen each
    time), per iteration between them: a trainer whose agent is quiet may time only some steps (one in five of
    20 ms ones, freeride.trainer.waits)."""
    first: dict[int, RecordedBubble] = {}
    for b in bubbles:
        seen = first.get(b.iteration)
        if seen is None or (b.slot, b.start_ns) < (seen.slot, seen.start_ns):
            first[b.iteration] = b
    order = sorted(first)
    periods = [(first[j].start_ns - first[i].start_ns) / (j - i) for i, j in itertools.pairwise(order)
               if first[j].slot == first[i].slot]
    return float(statistics.median(periods)) if periods else 0.0


def _by_rank(rec: Recording) -> dict[tuple[int, int], list[RecordedBubble]]:
    out: dict[tuple[int, int], list[RecordedBubble]] = defaultdict(list)
    for b in rec.bubbles:
        out[(b.gpu, b.rank)].append(b)
    return out


def steps_for(step_ms: float) -> tuple[str, float, whatif.StepSource]:
    return f"{step_ms:g}ms", step_ms, lambda: whatif.fixed_steps(int(step_ms * 1e6))


def task_steps(task_id: str, durations_ns: Sequence[int]) -> tuple[str, float, whatif.StepSource]:
    return f"task {task_id}", percentile(durations_ns, 0.5) / 1e6, lambda: whatif.drawn_steps(durations_ns)


def profile(rec: Recording, steps: Sequence[tuple[str, float, whatif.StepSource]] = ()) -> list[StageProfile]:
    """Every rank's profile, in (gpu, rank) order; `steps`: the what-if's step sources (steps_for, task_steps)."""
    declared = {(d.gpu, d.rank): d for d in rec.trainers}
    return [_stage(key, sorted(bubbles, key=lambda b: b.start_ns), declared.get(key), steps)
            for key, bubbles in sorted(_by_rank(rec).items())]


def _stage(key: tuple[int, int], bubbles: list[RecordedBubble], decl: Declaration | None,
           steps: Sequence[tuple[str, float, whatif.StepSource]]) -> StageProfile:
    gpu, rank = key
    schedule = decl.schedule if decl else ""
    th = theory(schedule, decl.stages, decl.microbatches, decl.stages_per_rank) if decl else theory("", 0, 0)
    period = iteration_ns(bubbles)
    iterations = len({b.iteration for b in bubbles})
    slots = []
    for position, (slot, group) in enumerate(_slots(bubbles)):
        lengths = [b.end_ns - b.start_ns for b in group]
        mean = statistics.fmean(lengths)
        slots.append(SlotProfile(slot, slot_kind(schedule, group[-1].kind, position), len(lengths), mean / 1e6,
                                 percentile(lengths, 0.5) / 1e6, percentile(lengths, 0.95) / 1e6,
                                 mean / period if period else 0.0))
    idle = sum(b.end_ns - b.start_ns for b in bubbles if b.kind != _BETWEEN_STEPS)
    fraction = idle / (iterations * period) if iterations and period else 0.0
    profile = StageProfile(gpu, rank, decl.stage if decl else rank, iterations, period / 1e6, fraction, th, slots)
    if iterations <= whatif.LEARN_ITERATIONS:
        return _with(profile, [], f"needs more than {whatif.LEARN_ITERATIONS} iterations recorded "
                                  f"(the agent learns each slot first); {iterations} here")
    played = [whatif.Bubble(b.slot, b.iteration, b.start_ns, b.end_ns, b.kind) for b in bubbles]
    results = []
    for label, step_ms, source in steps:
        outcome = whatif.replay(played, source())
        results.append(WhatIf(label, step_ms, outcome.share, outcome.overrun_steps))
    return _with(profile, results, "")


def _with(p: StageProfile, results: list[WhatIf], note: str) -> StageProfile:
    return StageProfile(p.gpu, p.rank, p.stage, p.iterations, p.iteration_ms, p.bubble_fraction, p.theory, p.slots,
                        results, note)


def _slots(bubbles: Sequence[RecordedBubble]) -> Iterator[tuple[int, list[RecordedBubble]]]:
    """Each slot's bubbles, in slot order (a slot is the wait's ordinal in the iteration)."""
    groups: dict[int, list[RecordedBubble]] = defaultdict(list)
    for b in bubbles:
        groups[b.slot].append(b)
    for slot in sorted(groups):
        yield slot, groups[slot]

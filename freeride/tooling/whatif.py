"""What would a side task harvest from these bubbles? The agent's own scheduler replayed on a fake clock.

The recorded bubbles of one rank go through the real `Scheduler` (its per-slot `SlotPredictor`, the
overrun margin, the window timers, the accounting) exactly as the agent takes them; the worker is
played by its step gate's rule with the worker's own `StepEstimator`: after a grant it wakes
`grant_latency_ns` later (one figure, or a stream of them: one per grant), then runs a step only while
its estimate fits before the window's end, and finishes the step it is in when the window is revoked.
Nothing sleeps: a heap of timed events drives one fake clock. `freeride profile` asks it for each step
size; `freeride bench harvest` reports it beside the real agent's figure on the same bubbles, so the two
stay comparable.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from freeride.agent.control.scheduler import Scheduler, SchedulerConfig, TaskSlot
from freeride.agent.domain.events import Edge, Steps, WindowDone, WindowRecord
from freeride.agent.domain.model import Counters
from freeride.v1 import trainer_pb2
from freeride.worker.estimate import StepEstimator

LEARN_ITERATIONS = 2  # the first iterations of a replay teach the predictor; the share is measured after them
GRANT_LATENCY_NS = 150_000  # START -> the worker runs: the grant's p50 over the ring on a 2-core VM (benchmarks.md)
_BETWEEN_STEPS = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS
_TASK = "what-if"

StepSource = Callable[[], Iterator[int]]  # makes a fresh stream of step durations (ns) for one replay


class Bubble(NamedTuple):
    """One recorded bubble of one rank."""

    slot: int
    iteration: int
    start_ns: int
    end_ns: int
    kind: int = 0  # freeride.v1.BubbleKind; BETWEEN_STEPS is never harvested (as on the agent)


@dataclass(frozen=True)
class Outcome:
    """What the replayed task harvested from the bubbles after the first LEARN_ITERATIONS iterations."""

    bubble_ns: int  # harvestable bubble time measured (after learning)
    harvested_ns: int  # step time inside the bubbles
    steps: int
    overrun_steps: int
    overrun_ns: int
    iterations: int  # measured

    @property
    def share(self) -> float:
        """Harvested / bubble time: the share of the idle time the task turns into steps."""
        return self.harvested_ns / self.bubble_ns if self.bubble_ns else 0.0


def fixed_steps(step_ns: int, jitter_ns: int = 0, seed: int = 0) -> Iterator[int]:
    """Steps of `step_ns` each, uniformly ±`jitter_ns` (seeded: a replay is repeatable)."""
    rng = random.Random(seed)
    while True:
        yield step_ns + (rng.randint(-jitter_ns, jitter_ns) if jitter_ns else 0)


def drawn_steps(samples_ns: Sequence[int], seed: int = 0) -> Iterator[int]:
    """Steps drawn from a measured distribution (a task's recent step durations)."""
    if not samples_ns:
        raise ValueError("no step durations to draw from")
    rng = random.Random(seed)
    while True:
        yield rng.choice(samples_ns)


class _Clock:
    """The fake clock and its event heap: (instant, order of scheduling, action)."""

    def __init__(self) -> None:
        self.now = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when_ns: int, fn: Callable[[], None]) -> _Timer:
        timer = _Timer(fn)
        heapq.heappush(self._heap, (when_ns, next(self._order), timer.fire))
        return timer

    def run(self) -> None:
        while self._heap:
            when, _, fn = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            fn()


class _Timer:
    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def cancel(self) -> None:
        self._fn = None

    def fire(self) -> None:
        fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class _Worker:
    """The worker's step gate (freeride.worker.process) on the fake clock; the scheduler's WindowPort."""

    def __init__(self, clock: _Clock, steps: Iterator[int], latencies: Iterator[int]) -> None:
        self.scheduler: Scheduler | None = None
        self._clock = clock
        self._steps = steps
        self._latencies = latencies
        self._estimator = StepEstimator(warmup_steps=1)
        self._wid = 0
        self._until = 0
        self._open = False

    def grant(self, window_id: int, until_ns: int) -> None:
        self._wid, self._until, self._open = window_id, until_ns, True
        self._clock.at(self._clock.now + next(self._latencies), lambda: self._next(window_id))

    def revoke(self, window_id: int, until_ns: int) -> None:
        if window_id == self._wid:
            self._open = False  # seen at the gate: after the step in progress

    def _next(self, window_id: int) -> None:
        now = self._clock.now
        est = self._estimator.estimate_ns()
        if not self._open or now >= self._until or (est is not None and now + est > self._until):
            self._done(window_id, now)
            return
        duration = next(self._steps)
        self._clock.at(now + duration, lambda: self._stepped(window_id, now, duration))

    def _stepped(self, window_id: int, start_ns: int, duration_ns: int) -> None:
        self._estimator.add(duration_ns)
        assert self.scheduler is not None
        self.scheduler.on_steps(_TASK, Steps(window_id, [(start_ns, duration_ns)], {}, 0))
        self._next(window_id)

    def _done(self, window_id: int, now_ns: int) -> None:
        self._wid = 0
        assert self.scheduler is not None
        self.scheduler.on_window_done(_TASK, WindowDone(window_id, now_ns, self._estimator.estimate_ns() or 0))


def replay(
    bubbles: Iterable[Bubble],
    steps: Iterator[int],
    margin_ns: int | None = None,
    grant_latency_ns: int | Iterator[int] = GRANT_LATENCY_NS,
    learn_iterations: int = LEARN_ITERATIONS,
) -> Outcome:
    """Replay one rank's bubbles (in time order) with one side task whose step durations `steps` yields.

    `margin_ns`: the agent's --margin-ms (default: its default). `grant_latency_ns`: START -> the worker runs,
    one figure for every grant or a stream (e.g. `drawn_steps` over a run's measured grants). The share
    counts the iterations after the first `learn_iterations` (the agent grants no window while it learns
    a slot)."""
    ordered = sorted(bubbles, key=lambda b: (b.start_ns, b.end_ns))
    if not ordered:
        return Outcome(0, 0, 0, 0, 0, 0)
    clock = _Clock()
    latencies = itertools.repeat(grant_latency_ns) if isinstance(grant_latency_ns, int) else grant_latency_ns
    worker = _Worker(clock, steps, latencies)
    records: list[WindowRecord] = []
    config = SchedulerConfig() if margin_ns is None else SchedulerConfig(margin_ns=margin_ns)

    def account(record: WindowRecord, per_task: dict[str, Counters], total: Counters) -> None:
        records.append(record)

    scheduler = Scheduler(lambda: clock.now, clock.at, config, account, lambda task_id, window_id: None)
    worker.scheduler = scheduler
    scheduler.add_task(TaskSlot(_TASK, 0, worker, Counters()))
    iterations = sorted({b.iteration for b in ordered})
    measured = set(iterations[learn_iterations:])
    for b in ordered:
        harvestable = b.kind != _BETWEEN_STEPS
        clock.at(b.start_ns, lambda b=b, h=harvestable: scheduler.on_bubble(  # type: ignore[misc]
            Edge(True, h, 0, b.slot, b.iteration, b.start_ns, kind=b.kind)))
        clock.at(b.end_ns, lambda b=b, h=harvestable: scheduler.on_bubble(  # type: ignore[misc]
            Edge(False, h, 0, b.slot, b.iteration, b.end_ns, kind=b.kind)))
    clock.run()
    kept = [r for r in records if r.iteration in measured]
    return Outcome(
        bubble_ns=sum(b.end_ns - b.start_ns for b in ordered if b.iteration in measured and b.kind != _BETWEEN_STEPS),
        harvested_ns=sum(s.busy_ns - s.overrun_ns for r in kept for s in r.shares),
        steps=sum(s.steps for r in kept for s in r.shares),
        overrun_steps=sum(1 for r in kept for s in r.shares if s.overrun_ns > 0),
        overrun_ns=sum(s.overrun_ns for r in kept for s in r.shares),
        iterations=len(measured),
    )

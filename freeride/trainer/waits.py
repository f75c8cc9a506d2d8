"""What every framework integration does around a pipeline wait: number it, classify it, report it.

A framework hook calls `begin_step()` / `end_step()` around one training iteration and wraps
each blocking receive in `wait(direction, fn)`. The k-th wait of a step is slot k, so the same
bubble gets the same slot in every iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from freeride.trainer.edges import EdgeClock, InlineClock
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import trainer_pb2

T = TypeVar("T")

BETWEEN_STEPS_SLOT = 1 << 20  # the gap between two steps: optimizer, data loading
FILL, WARMUP, DRAIN, COOLDOWN, BETWEEN = (
    trainer_pb2.BUBBLE_KIND_FILL,
    trainer_pb2.BUBBLE_KIND_WARMUP,
    trainer_pb2.BUBBLE_KIND_DRAIN,
    trainer_pb2.BUBBLE_KIND_COOLDOWN,
    trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS,
)
FWD, BWD, END_OF_STEP = 1, 2, 4  # what a wait receives: activations, gradients, or the step's end


@dataclass
class BubbleRecord:
    """One bubble, kept when recording (tests, benchmarks, timelines)."""

    iteration: int
    slot: int
    kind: int
    start_ns: int
    end_ns: int
    reported: bool = True


@dataclass
class WaitTracker:
    """Numbers, classifies and reports the waits of one rank. Each edge goes through `clock`, which
    says when the GPU really reached it (`freeride.trainer.edges`): inline on the training thread
    (modes `stream`, `off`) or later on its watcher thread (`event`); the bookkeeping that needs the
    edge's time (a slot's length, the recorded bubbles) runs where the edge is reported."""

    reporter: BubbleReporter
    clock: EdgeClock = field(default_factory=InlineClock)
    record: bool = False
    min_report_ns: int = 1_000_000
    enabled: bool = True  # False: steps run exactly as without freeride (for A/B measurements)
    free_memory: Callable[[], int] | None = None  # CUDA: bytes the trainer leaves free on its GPU
    iteration: int = -1
    waits_seen: int = 0
    bubbles: list[BubbleRecord] = field(default_factory=list)
    _ordinal: int = 0
    _seen_bwd: bool = False
    _between_open: bool = False
    _open_ns: dict[int, int] = field(default_factory=dict)  # slot -> when its open bubble started
    _last_ns: dict[int, int] = field(default_factory=dict)  # slot -> its length last iteration
    _free_bytes: int = 0
    _direct: bool = False  # the clock is inline with no sync: wait edges are stamped here, with no _Edge made

    def __post_init__(self) -> None:
        self._direct = bool(getattr(self.clock, "direct", False))

    @property
    def edge_mode(self) -> str:
        return self.clock.mode

    def begin_step(self) -> None:
        if self._between_open:
            self._between_open = False
            # at the CPU's time, as ever: the step's first kernels are about to be queued
            self.clock.then(_Edge(self, BETWEEN_STEPS_SLOT, BETWEEN, True, 0, False, time.monotonic_ns()).run)
        self.iteration += 1
        self.clock.then(_SetIteration(self.reporter, self.iteration).run)
        self._ordinal = 0
        self._seen_bwd = False
        if self.free_memory is not None:
            self._free_bytes = self.free_memory()

    def end_step(self) -> None:
        self._between_open = True
        self.clock.edge(_Edge(self, BETWEEN_STEPS_SLOT, BETWEEN, True, 0, True).stamp)

    def skip_step(self) -> None:
        """A step run with `enabled` False: the next step has no between-steps gap to report."""
        self._between_open = False

    def close(self) -> None:
        """Report what the clock still holds and stop its thread (if it has one)."""
        self.clock.close()

    def wait(self, direction: int, fn: Callable[[], T]) -> T:
        token = self.begin_wait(direction)
        try:
            return fn()
        finally:
            self.end_wait(token)

    def begin_wait(self, direction: int) -> tuple[int, int, bool, int]:
        """The rank is about to block on a peer; pass the result to end_wait()."""
        slot = self._ordinal
        self._ordinal = slot + 1
        self.waits_seen += 1
        kind = self._kind(direction)
        # A wait that was too short to harvest last iteration is not reported (it keeps its slot
        # number): a side task could not use it, and every edge costs the agent some CPU.
        report = self._last_ns.get(slot, self.min_report_ns) >= self.min_report_ns
        if self._direct:  # a CPU stage: the edge's time is now, kept in the token (no object made for it)
            if report:
                self.reporter.start(slot, kind, free_memory_bytes=self._free_bytes)
            return slot, kind, report, time.monotonic_ns()
        # START once the GPU has finished what was queued before the wait
        self.clock.edge(_Edge(self, slot, kind, report, self._free_bytes, True).stamp)
        return slot, kind, report, 0

    def end_wait(self, token: tuple[int, int, bool, int]) -> None:
        slot, kind, report, start = token
        if self._direct:  # the hook runs on caches the compute has just evicted: as little as it can
            now = time.monotonic_ns()
            if report:
                self.reporter.end(slot, kind)
            self._last_ns[slot] = now - start
            if self.record:
                self.bubbles.append(BubbleRecord(self.iteration, slot, kind, start, now, report))
            return
        self.clock.edge(_Edge(self, slot, kind, report, 0, False).stamp)  # END once the received data has landed

    def _started(self, slot: int, kind: int, report: bool, free_bytes: int, now: int) -> None:
        self._open_ns[slot] = now
        if report:
            self.reporter.start(slot, kind, free_memory_bytes=free_bytes)

    def _ended(self, slot: int, kind: int, report: bool, now: int) -> None:
        start = self._open_ns.pop(slot, now)
        if report:
            self.reporter.end(slot, kind)
        if slot != BETWEEN_STEPS_SLOT:
            self._last_ns[slot] = now - start
        self._keep(slot, kind, start, now, report)

    def _kind(self, direction: int) -> int:
        if direction & END_OF_STEP:
            return DRAIN
        if direction & BWD:
            kind = COOLDOWN if self._seen_bwd else WARMUP
            self._seen_bwd = True
            return kind
        if direction & FWD:
            return COOLDOWN if self._seen_bwd else FILL
        return DRAIN  # only sends: waiting for a neighbour to take what this stage produced

    def _keep(self, slot: int, kind: int, start: int, end: int, reported: bool) -> None:
        if self.record:
            self.bubbles.append(BubbleRecord(self.iteration, slot, kind, start, end, reported))


class _Edge:
    """One edge waiting for its time (a slotted record: the hook allocates one small object per edge)."""

    __slots__ = ("at", "free_bytes", "kind", "report", "slot", "start", "tracker")

    def __init__(self, tracker: WaitTracker, slot: int, kind: int, report: bool, free_bytes: int, start: bool,
                 at: int = 0) -> None:
        self.tracker, self.slot, self.kind, self.report, self.free_bytes, self.start, self.at = (
            tracker, slot, kind, report, free_bytes, start, at)

    def run(self) -> None:
        self.stamp(self.at)

    def stamp(self, now: int) -> None:
        if self.start:
            self.tracker._started(self.slot, self.kind, self.report, self.free_bytes, now)
        else:
            self.tracker._ended(self.slot, self.kind, self.report, now)


class _SetIteration:
    __slots__ = ("iteration", "reporter")

    def __init__(self, reporter: BubbleReporter, iteration: int) -> None:
        self.reporter, self.iteration = reporter, iteration

    def run(self) -> None:
        self.reporter.set_iteration(self.iteration)


class Instrumented:
    """What every framework integration returns: its tracker, and the hooks to undo."""

    def __init__(self, tracker: WaitTracker) -> None:
        self.tracker = tracker
        self._undo: list[Callable[[], None]] = [tracker.close]  # the last undone: edges already queued are reported

    @property
    def reporter(self) -> BubbleReporter:
        return self.tracker.reporter

    @property
    def bubbles(self) -> list[BubbleRecord]:
        return self.tracker.bubbles

    @property
    def edge_mode(self) -> str:
        """How bubble edges are taken: stream, event or off (see freeride.trainer.edges)."""
        return self.tracker.edge_mode

    @property
    def enabled(self) -> bool:
        return self.tracker.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.tracker.enabled = value

    def undo(self) -> None:
        """Remove this integration's hooks (shared module hooks stay while others use them)."""
        while self._undo:
            self._undo.pop()()

    def close(self) -> None:
        """undo() and close the reporter (flushing what is queued)."""
        self.undo()
        self.reporter.close()


def restore_attribute(obj: object, name: str) -> None:
    """Drop the instance attribute that shadowed the class's."""
    obj.__dict__.pop(name, None)

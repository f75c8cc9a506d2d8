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
    reporter: BubbleReporter
    sync: Callable[[], None] | None = None  # CUDA: synchronise the stream at bubble edges
    record: bool = False
    min_report_ns: int = 1_000_000
    enabled: bool = True  # False: steps run exactly as without freeride (for A/B measurements)
    free_memory: Callable[[], int] | None = None  # CUDA: bytes the trainer leaves free on its GPU
    iteration: int = -1
    waits_seen: int = 0
    bubbles: list[BubbleRecord] = field(default_factory=list)
    _ordinal: int = 0
    _seen_bwd: bool = False
    _after_step_ns: int = 0
    _last_ns: dict[int, int] = field(default_factory=dict)  # slot -> its length last iteration
    _free_bytes: int = 0

    def begin_step(self) -> None:
        now = time.monotonic_ns()
        if self._after_step_ns:
            self.reporter.end(BETWEEN_STEPS_SLOT, BETWEEN)
            self._keep(BETWEEN_STEPS_SLOT, BETWEEN, self._after_step_ns, now, True)
        self.iteration += 1
        self.reporter.set_iteration(self.iteration)
        self._ordinal = 0
        self._seen_bwd = False
        if self.free_memory is not None:
            self._free_bytes = self.free_memory()

    def end_step(self) -> None:
        if self.sync is not None:
            self.sync()
        self._after_step_ns = time.monotonic_ns()
        self.reporter.start(BETWEEN_STEPS_SLOT, BETWEEN)

    def skip_step(self) -> None:
        """A step run with `enabled` False: the next step has no between-steps gap to report."""
        self._after_step_ns = 0

    def wait(self, direction: int, fn: Callable[[], T]) -> T:
        token = self.begin_wait(direction)
        try:
            return fn()
        finally:
            self.end_wait(token)

    def begin_wait(self, direction: int) -> tuple[int, int, int, bool]:
        """The rank is about to block on a peer; pass the result to end_wait()."""
        slot = self._ordinal
        self._ordinal += 1
        self.waits_seen += 1
        kind = self._kind(direction)
        # A wait that was too short to harvest last iteration is not reported (it keeps its slot
        # number): a side task could not use it, and every edge costs the agent some CPU.
        report = self._last_ns.get(slot, self.min_report_ns) >= self.min_report_ns
        if self.sync is not None:
            self.sync()  # the GPU has finished what was queued before the wait
        start = time.monotonic_ns()
        if report:
            self.reporter.start(slot, kind, free_memory_bytes=self._free_bytes)
        return slot, kind, start, report

    def end_wait(self, token: tuple[int, int, int, bool]) -> None:
        slot, kind, start, report = token
        if self.sync is not None:
            self.sync()  # the received data has landed
        end = time.monotonic_ns()
        if report:
            self.reporter.end(slot, kind)
        self._last_ns[slot] = end - start
        self._keep(slot, kind, start, end, report)

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


class Instrumented:
    """What every framework integration returns: its tracker, and the hooks to undo."""

    def __init__(self, tracker: WaitTracker) -> None:
        self.tracker = tracker
        self._undo: list[Callable[[], None]] = []

    @property
    def reporter(self) -> BubbleReporter:
        return self.tracker.reporter

    @property
    def bubbles(self) -> list[BubbleRecord]:
        return self.tracker.bubbles

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

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

from freeride.core.ring import KIND_BETWEEN_STEPS, KIND_COOLDOWN, KIND_DRAIN, KIND_FILL, KIND_WARMUP
from freeride.trainer.edges import EdgeClock, InlineClock
from freeride.trainer.reporter import BubbleReporter

T = TypeVar("T")

# DeepSpeed's default `quiet_sample_ms`: while the agent is quiet, a CPU stage times one step every half second.
# Measured (docs/benchmarks.md, "fourth pass"): an idle instrumented DeepSpeed step then costs +0.2 % CPU at the
# median, against +0.5 % timing every step, on a 2-core VM whose floor is ±0.3 %.
DEFAULT_QUIET_SAMPLE_MS = 500.0

BETWEEN_STEPS_SLOT = 1 << 20  # the gap between two steps: optimizer, data loading
FILL, WARMUP, DRAIN, COOLDOWN, BETWEEN = KIND_FILL, KIND_WARMUP, KIND_DRAIN, KIND_COOLDOWN, KIND_BETWEEN_STEPS
FWD, BWD, END_OF_STEP = 1, 2, 4  # what a wait receives: activations, gradients, or the step's end
GAP = -1  # in a quiet step's log: the gap between two steps


@dataclass(slots=True)
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
    # While the agent is quiet (nothing to grant) on a CPU stage, each wait of a step only appends (direction,
    # start, end) to `quiet_log`: the steps' waits are numbered, classified and reported together, in one write,
    # at the end of the step that finds the oldest of them `quiet_flush_ns` old (and when the tracker closes): on
    # cold caches the hook does the least it can, and the agent sees them that late at most (it reads a quiet ring
    # late anyway).
    quiet_flush_ns: int = 100_000_000
    # And while it is quiet, a CPU stage may time only some steps: one that begins `quiet_sample_ns` or more
    # after the last timed one began (0: every step). The integration asks `timed()` before a step and runs an
    # untimed one as a skipped step, with its hooks off where it can take them off (DeepSpeed's instruction
    # map): a profile needs the slots' lengths, not every iteration's, and a 20 ms step costs ~1/5 then. A timed
    # step's edges say how many steps it stands for (itself and the untimed ones before it: BubbleReporter's
    # `stands_for`), and the agent weights its bubble counters (stats, /metrics) by that, so they stay whole
    # (within the time that has passed: freeride.agent.control.idle).
    quiet_sample_ns: int = 0
    quiet_log: list[int] | None = None
    # (iteration, free bytes, log, the iterations it stands for)
    _quiet_steps: list[tuple[int, int, list[int], int]] = field(default_factory=list)
    _untimed_run: int = 0  # untimed steps since the last timed one: the next timed quiet step stands for them too
    _stands_for: int = 1  # the quiet step being timed: itself and the untimed steps before it
    _quiet: bool | None = None  # whether the reporter holds edges (the agent quiet), as last asked; None: ask
    _asked: bool = False  # (not a CPU stage) the last step's end asked the reporter whether to hold
    _held_since_ns: int = 0  # when the oldest of _quiet_steps ended
    _gap_ns: int = 0  # when the gap after a quiet step began (reported with that step's waits)
    _timed_ns: int = 0  # when the last timed step began (quiet_sample_ns)
    untimed_steps: int = 0  # steps the quiet agent let go untimed

    def __post_init__(self) -> None:
        self._direct = bool(getattr(self.clock, "direct", False))

    @property
    def edge_mode(self) -> str:
        return self.clock.mode

    def timed(self) -> bool:
        """Whether the step about to begin is timed: always, unless the agent is quiet on a CPU stage and the last
        timed step began less than `quiet_sample_ns` ago. An untimed step is run as a skipped one (skip_step).
        The ring's quiet word is read for every step, so an agent that starts to listen has the next one timed."""
        if not self.quiet_sample_ns or not self._direct:
            return True
        now = time.monotonic_ns()
        if not self._quiet or now - self._timed_ns >= self.quiet_sample_ns or not self.reporter.agent_quiet:
            self._timed_ns = now
            return True
        self.untimed_steps += 1
        self._untimed_run += 1
        self.iteration += 1  # it is an iteration all the same: the timed ones keep their numbers (profile periods)
        return False

    def begin_step(self) -> None:
        if self._direct:
            self._begin_direct_step()
            return
        self.iteration += 1
        self._ordinal = 0
        self._seen_bwd = False
        if self.free_memory is not None:
            self._free_bytes = self.free_memory()
        reporter = self.reporter
        if self._between_open:
            self._between_open = False
            # at the CPU's time, as ever: the step's first kernels are about to be queued
            self.clock.then(_Edge(self, BETWEEN_STEPS_SLOT, BETWEEN, True, 0, False, time.monotonic_ns()).run)
        self.clock.then(_SetIteration(reporter, self.iteration).run)
        if not self._asked:
            self.clock.then(reporter.hold)  # while the agent is quiet, the step's edges go in one write at its end
        self._asked = False

    def end_step(self) -> None:
        self._between_open = True
        if self._direct:
            self._end_direct_step()
            return
        self.clock.edge(_Edge(self, BETWEEN_STEPS_SLOT, BETWEEN, True, 0, True).stamp)
        # What the reporter held is written now, in one pass (BubbleReporter.hold); then it asks whether to hold
        # the gap's and the next step's edges too (the agent still quiet).
        self.clock.then(self.reporter.flush)
        self.clock.then(self.reporter.hold)
        self._asked = True  # (on the clock's thread): the next step need not ask

    def skip_step(self) -> None:
        """A step run with `enabled` False: the next step has no between-steps gap to report. On a CPU stage it
        costs nothing more: what quiet steps kept waits for the next step that ends (or for close)."""
        self._between_open = False
        self._gap_ns = 0  # a quiet step's gap that never ends: not reported
        if not self._direct:
            self.clock.then(self.reporter.flush)

    def close(self) -> None:
        """Report what the clock still holds and stop its thread (if it has one)."""
        self.clock.close()
        if self._quiet_steps or self.quiet_log is not None:
            self._flush_quiet()
        self.reporter.flush()  # the clock's thread is gone: this is the only caller now

    # -- a CPU stage (edges at the CPU's time, stamped here): while the agent is quiet, steps only time waits --
    def _begin_direct_step(self) -> None:
        now = time.monotonic_ns()
        if self.quiet_log is not None:  # the last step did not end here (a replay that only begins steps)
            self._keep_quiet_step(now)
        if self._between_open:
            self._between_open = False
            if self._gap_ns:  # the gap after a quiet step goes into that step's log
                self._quiet_steps[-1][2].extend((GAP, self._gap_ns, now))
                self._gap_ns = 0
            else:
                self._ended(BETWEEN_STEPS_SLOT, BETWEEN, True, now)
        self.iteration += 1
        self._ordinal = 0
        self._seen_bwd = False
        if self.free_memory is not None:
            self._free_bytes = self.free_memory()
        if self._quiet is None:
            self._quiet = self.reporter.hold()
        if self._quiet:
            self.quiet_log = []
            self._stands_for = 1 + self._untimed_run
        else:  # (the agent listens again: untimed steps just before this one are not counted)
            self.reporter.set_iteration(self.iteration)
        self._untimed_run = 0

    def _end_direct_step(self) -> None:
        now = time.monotonic_ns()
        if self.quiet_log is not None:
            self._gap_ns = now
            self._keep_quiet_step(now)
            return
        self._started(BETWEEN_STEPS_SLOT, BETWEEN, True, 0, now)
        self.reporter.flush()
        self._quiet = self.reporter.hold()  # right after the write: the ring's page is warm

    def _keep_quiet_step(self, now: int) -> None:
        """The step that only timed its waits is over: keep them, and write what is kept once it is old enough."""
        if not self._quiet_steps:
            self._held_since_ns = now
        self._push_quiet_log()
        if now - self._held_since_ns >= self.quiet_flush_ns:
            self._flush_quiet()

    def _push_quiet_log(self) -> None:
        log = self.quiet_log
        assert log is not None
        self._quiet_steps.append((self.iteration, self._free_bytes, log, self._stands_for))
        self._stands_for = 1
        self.quiet_log = None
        self.waits_seen += len(log) // 3

    def _flush_quiet(self) -> None:
        """Report the waits the quiet steps only timed, as begin_wait/end_wait would have, each at its own time,
        in one write; then ask the reporter again whether to hold (the agent may listen now)."""
        if self.quiet_log is not None:
            self._push_quiet_log()
        steps, self._quiet_steps = self._quiet_steps, []
        reporter = self.reporter
        for iteration, free, log, stands_for in steps:
            reporter.set_iteration(iteration)
            self._replay(iteration, free, log, stands_for)
        if self._gap_ns:  # the last step's gap is open: its start goes with them, its end as it comes
            self._started(BETWEEN_STEPS_SLOT, BETWEEN, True, 0, self._gap_ns)
            self._gap_ns = 0
        reporter.set_iteration(self.iteration)
        reporter.flush()
        self._quiet = reporter.hold()

    def _replay(self, iteration: int, free: int, log: list[int], stands_for: int) -> None:
        reporter, last, minimum = self.reporter, self._last_ns, self.min_report_ns
        record = self.bubbles.append if self.record else None
        slot, seen_bwd = 0, False
        for direction, start, end in zip(log[0::3], log[1::3], log[2::3], strict=True):
            if direction == GAP:
                reporter.start(BETWEEN_STEPS_SLOT, BETWEEN, time_ns=start, stands_for=stands_for)
                reporter.end(BETWEEN_STEPS_SLOT, BETWEEN, time_ns=end, stands_for=stands_for)
                if record is not None:
                    record(BubbleRecord(iteration, BETWEEN_STEPS_SLOT, BETWEEN, start, end, True))
                continue
            kind, seen_bwd = _classify(direction, seen_bwd)
            report = last.get(slot, minimum) >= minimum
            if report:
                reporter.start(slot, kind, free_memory_bytes=free, time_ns=start, stands_for=stands_for)
                reporter.end(slot, kind, time_ns=end, stands_for=stands_for)
            last[slot] = end - start
            if record is not None:
                record(BubbleRecord(iteration, slot, kind, start, end, report))
            slot += 1

    def wait(self, direction: int, fn: Callable[[], T]) -> T:
        token = self.begin_wait(direction)
        try:
            return fn()
        finally:
            self.end_wait(token)

    def begin_wait(self, direction: int) -> tuple[int, int, bool, int]:
        """The rank is about to block on a peer; pass the result to end_wait()."""
        if self.quiet_log is not None:  # only timed: numbered and reported at the step's end
            return -1, direction, False, time.monotonic_ns()
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
        if slot < 0:  # a quiet step's wait: kind is its direction
            log = self.quiet_log
            if log is not None:
                log += (kind, start, time.monotonic_ns())
            return
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
            self.reporter.start(slot, kind, free_memory_bytes=free_bytes, time_ns=now)

    def _ended(self, slot: int, kind: int, report: bool, now: int) -> None:
        start = self._open_ns.pop(slot, now)
        if report:
            self.reporter.end(slot, kind, time_ns=now)
        if slot != BETWEEN_STEPS_SLOT:
            self._last_ns[slot] = now - start
        self._keep(slot, kind, start, now, report)

    def _kind(self, direction: int) -> int:
        kind, self._seen_bwd = _classify(direction, self._seen_bwd)
        return kind

    def _keep(self, slot: int, kind: int, start: int, end: int, reported: bool) -> None:
        if self.record:
            self.bubbles.append(BubbleRecord(self.iteration, slot, kind, start, end, reported))


def _classify(direction: int, seen_bwd: bool) -> tuple[int, bool]:
    """A wait's kind from what it receives and whether the step has received gradients yet (and, after it)."""
    if direction & END_OF_STEP:
        return DRAIN, seen_bwd
    if direction & BWD:
        return (COOLDOWN if seen_bwd else WARMUP), True
    if direction & FWD:
        return (COOLDOWN if seen_bwd else FILL), seen_bwd
    return DRAIN, seen_bwd  # only sends: waiting for a neighbour to take what this stage produced


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

"""Whether the worker's next step may run now: a pure decision, from the window word, the clock, what the worker
holds and what its steps are expected to take. No I/O and no clock of its own: the gate (freeride.worker.gate)
reads, asks `judge`, acts on the verdict and waits; this module is tested as a table (tests/unit/worker).

The verdicts, in the order they are judged:
  IDLE      no window held and none new: wait for the word or a wake-up
  REVOKED   the window held (or one granted and revoked before this worker looked) is closed: report it
  GRANTED   a new open window: take it, then judge it from the same word (a grant's first step needs no re-read)
  EXPIRED   the window's end has passed
  STEP      the next step fits before the window's end (or nothing is known of it yet): run it
  OUTLIER   granted, yet no step fits, on measured steps only, before any step in this window: a stale slow
            sample may be all that keeps the task out; drop it (StepEstimator.forget_outlier) and judge again,
            or NO_FIT if none was dropped
  PROBE     the task's declared smallest step fit none of PROBE_AFTER_WINDOWS windows in a row: one step anyway,
            which sizes itself to what is left (only a step can refresh what a task declares); or all that is
            known is the left-out warm-up step, far beyond every window (Estimates.cold), and it fit none of as
            many windows: one step re-measures it. A first step pays for lazy set-up (imports, connections,
            kernels, a compile) and a loaded machine may stretch it tenfold: judged by it for good, a task whose
            later steps fit would never step again. Once: that step's sample replaces it, and a step really that
            long stays out (a lone sample far beyond is kept: StepEstimator.forget_outlier)
  NO_FIT    the next step would not fit: give the window back
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from freeride.core.window import WindowWord

PROBE_AFTER_WINDOWS = 8  # a task whose declared smallest step fit none of this many windows steps anyway
# A step is never run on no evidence (a probe, a step after the warm-up) when what is known of it is more than
# this many times the longest window this worker was granted: that step would overrun a bubble by seconds.
FAR_BEYOND = 8


class Verdict(enum.Enum):
    IDLE = "idle"
    REVOKED = "revoked"
    GRANTED = "granted"
    EXPIRED = "expired"
    STEP = "step"
    OUTLIER = "outlier"
    PROBE = "probe"
    NO_FIT = "no fit"


@dataclass(frozen=True)
class Held:
    """What the worker holds when it judges."""

    window_id: int = 0  # the window held; 0: none
    until_ns: int = 0  # its predicted end
    last_window_id: int = 0  # the latest window this worker ended (grants up to it are old)
    stepped: bool = False  # whether a step ran in the window held
    unfit_windows: int = 0  # windows in a row in which the declared smallest step did not fit


@dataclass(frozen=True)
class Estimates:
    """What the next step is expected to take (ns): what the task declares (IterativeTask.min_step_s) wins over
    the measured estimate; `longest_window_ns`: the longest window granted to this worker (0: none yet)."""

    declared_ns: int | None = None
    measured_ns: int | None = None
    longest_window_ns: int = 0
    cold: bool = False  # measured_ns is the left-out warm-up step, the only step measured (far beyond every window)

    @property
    def next_step_ns(self) -> int | None:
        return self.declared_ns if self.declared_ns is not None else self.measured_ns

    def far_beyond(self, duration_ns: int) -> bool:
        """Whether a step this long would overrun any window seen by far: never run on no evidence."""
        return self.longest_window_ns > 0 and duration_ns > FAR_BEYOND * self.longest_window_ns


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    unfit_windows: int  # the count to hold after this decision


def judge(word: WindowWord, now_ns: int, held: Held, est: Estimates) -> Decision:
    """The verdict on the next step (module docstring), and the unfit-window count that follows it."""
    unfit = held.unfit_windows
    if not held.window_id:
        if word.window_id <= held.last_window_id:
            return Decision(Verdict.IDLE, unfit)
        return Decision(Verdict.GRANTED if word.open else Verdict.REVOKED, unfit)
    if word.window_id != held.window_id or not word.open:
        return Decision(Verdict.REVOKED, unfit)
    if now_ns >= held.until_ns:
        return Decision(Verdict.EXPIRED, unfit)
    step_ns = est.next_step_ns
    if step_ns is None or now_ns + step_ns <= held.until_ns:
        return Decision(Verdict.STEP, 0)
    if held.stepped:
        return Decision(Verdict.NO_FIT, unfit)
    if est.declared_ns is None:
        if not est.cold:
            return Decision(Verdict.OUTLIER, unfit)
    elif est.far_beyond(est.declared_ns):
        return Decision(Verdict.NO_FIT, unfit)
    if unfit + 1 >= PROBE_AFTER_WINDOWS:
        return Decision(Verdict.PROBE, 0)
    return Decision(Verdict.NO_FIT, unfit + 1)

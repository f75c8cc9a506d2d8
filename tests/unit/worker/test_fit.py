"""Specification of the worker's step decision (freeride.worker.fit): one row per case, no clock, no pipe."""

from __future__ import annotations

import pytest

from freeride.core.window import WindowWord
from freeride.worker.fit import FAR_BEYOND, PROBE_AFTER_WINDOWS, Decision, Estimates, Held, Verdict, judge

MS = 1_000_000
NOW = 1_000 * MS
HELD = Held(window_id=3, until_ns=NOW + 10 * MS, last_window_id=2)  # window 3, 10 ms left
OPEN3 = WindowWord(3, NOW + 10 * MS, True)

ROWS = [
    # (what the case is, the word, what is held, the estimates, the verdict, the unfit count after)
    ("no window, nothing new: wait", WindowWord(2, 0, False), Held(last_window_id=2), Estimates(), Verdict.IDLE, 0),
    ("an old grant is no grant", WindowWord(2, NOW + MS, True), Held(last_window_id=2), Estimates(),
     Verdict.IDLE, 0),
    ("a new open window is granted", OPEN3, Held(last_window_id=2), Estimates(), Verdict.GRANTED, 0),
    ("granted and revoked before the worker looked", WindowWord(3, NOW, False), Held(last_window_id=2),
     Estimates(), Verdict.REVOKED, 0),
    ("the held window was closed", WindowWord(3, NOW + 10 * MS, False), HELD, Estimates(), Verdict.REVOKED, 0),
    ("a newer window replaced the held one", WindowWord(4, NOW + 10 * MS, True), HELD, Estimates(),
     Verdict.REVOKED, 0),
    ("its end has passed", WindowWord(3, NOW, True), Held(3, NOW, 2), Estimates(measured_ns=MS), Verdict.EXPIRED, 0),
    ("nothing known of a step: step", OPEN3, HELD, Estimates(), Verdict.STEP, 0),
    ("a measured step fits", OPEN3, HELD, Estimates(measured_ns=4 * MS), Verdict.STEP, 0),
    ("a step that ends exactly at the window's end fits", OPEN3, HELD, Estimates(measured_ns=10 * MS),
     Verdict.STEP, 0),
    ("a fitting step clears the unfit count", OPEN3, Held(3, NOW + 10 * MS, 2, unfit_windows=5),
     Estimates(declared_ns=MS), Verdict.STEP, 0),
    ("the declaration wins over the measure", OPEN3, HELD, Estimates(declared_ns=MS, measured_ns=50 * MS),
     Verdict.STEP, 0),
    ("no fit after a step in this window", OPEN3, Held(3, NOW + 10 * MS, 2, stepped=True),
     Estimates(measured_ns=20 * MS), Verdict.NO_FIT, 0),
    ("no fit on measured steps alone, before any step: an outlier may be to blame", OPEN3, HELD,
     Estimates(measured_ns=20 * MS), Verdict.OUTLIER, 0),
    ("a declared step that does not fit counts the window", OPEN3, HELD,
     Estimates(declared_ns=20 * MS, longest_window_ns=10 * MS), Verdict.NO_FIT, 1),
    ("the declared step fit none of the last windows: one probe", OPEN3,
     Held(3, NOW + 10 * MS, 2, unfit_windows=PROBE_AFTER_WINDOWS - 1),
     Estimates(declared_ns=20 * MS, longest_window_ns=10 * MS), Verdict.PROBE, 0),
    ("never a probe far beyond every window seen", OPEN3,
     Held(3, NOW + 10 * MS, 2, unfit_windows=PROBE_AFTER_WINDOWS - 1),
     Estimates(declared_ns=(FAR_BEYOND * 10 + 1) * MS, longest_window_ns=10 * MS), Verdict.NO_FIT,
     PROBE_AFTER_WINDOWS - 1),
    ("the warm-up step alone, far beyond: no outlier to drop, the window is counted", OPEN3, HELD,
     Estimates(measured_ns=(FAR_BEYOND * 10 + 1) * MS, longest_window_ns=10 * MS, cold=True), Verdict.NO_FIT, 1),
    ("the warm-up step alone fit none of the last windows: one step re-measures it", OPEN3,
     Held(3, NOW + 10 * MS, 2, unfit_windows=PROBE_AFTER_WINDOWS - 1),
     Estimates(measured_ns=(FAR_BEYOND * 10 + 1) * MS, longest_window_ns=10 * MS, cold=True), Verdict.PROBE, 0),
    ("a measured sample far beyond, not the warm-up: never a probe", OPEN3,
     Held(3, NOW + 10 * MS, 2, unfit_windows=PROBE_AFTER_WINDOWS - 1),
     Estimates(measured_ns=(FAR_BEYOND * 10 + 1) * MS, longest_window_ns=10 * MS), Verdict.OUTLIER,
     PROBE_AFTER_WINDOWS - 1),
]


@pytest.mark.parametrize(("word", "held", "est", "verdict", "unfit"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_decision(word: WindowWord, held: Held, est: Estimates, verdict: Verdict, unfit: int) -> None:
    assert judge(word, NOW, held, est) == Decision(verdict, unfit)


def test_far_beyond_needs_a_window_seen() -> None:
    assert not Estimates().far_beyond(10**12)  # no window yet: nothing to compare with
    assert Estimates(longest_window_ns=MS).far_beyond(FAR_BEYOND * MS + 1)
    assert not Estimates(longest_window_ns=MS).far_beyond(FAR_BEYOND * MS)

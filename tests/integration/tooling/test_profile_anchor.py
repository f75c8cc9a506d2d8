"""The what-if agrees with `freeride bench harvest` on the anchor trace (1F1B, p=4, m=4, F=20, B=40, 5 ms steps).

bench harvest replays the trace in real time through a real agent and a real worker; the profile's what-if
replays the bubbles that same run measured through the scheduler on a fake clock, given the grant latencies
and step durations the run measured (a loaded runner wakes slower and stretches sleeps: the nominal replay,
150 µs grants and exact 5 ms steps, is reported beside it). After learning, the two harvested shares must
agree within 2 points. On a machine whose steps overshoot their 5 ms, or whose grants their 150 µs, by more
than the tests' 1 ms, the order of the slow ones decides a few more points than the replays' drawn order can
follow: the test then skips, saying so with the figures (support.jitter).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.jitter import Jitter, judge

pytestmark = pytest.mark.serial  # a real-time bench harvest efficiency against the what-if


@pytest.mark.slow
def test_the_what_if_agrees_with_bench_harvest_on_the_anchor_trace() -> None:
    out = subprocess.run([sys.executable, "-m", "freeride", "bench", "harvest", "--schedule", "1F1B", "-p", "4",
                          "-m", "4", "-F", "20", "-B", "40", "--stage", "1", "--step-ms", "5", "--iterations", "40",
                          "--json"], capture_output=True, text=True, timeout=240, check=True)
    r = json.loads(out.stdout)
    assert r["steps"] > 0
    assert r["whatif_nominal_efficiency_after_learning"] >= r["whatif_efficiency_after_learning"] - 0.02, r
    gap = r["efficiency_after_learning"] - r["whatif_efficiency_after_learning"]
    # the machine in this run: how far its steps (p50, p90) overshot their sleep, and its grants (p50) the nominal
    # replay's 150 µs
    jitter = Jitter.of_slices([(r["step_ms_p50"], r["S_ms"], 1), (r["step_ms_p90"], r["S_ms"], 1),
                               (r["grant_us_p50"] / 1e3, 0.15, 1)])
    judge([f"measured {r['efficiency_after_learning']:.3f} against the what-if's "
           f"{r['whatif_efficiency_after_learning']:.3f} (steps {r['step_ms_p50']} ms p50, {r['step_ms_p90']} ms p90)"]
          if abs(gap) > 0.02 else [], jitter, "the harvest against its what-if (2 points)")

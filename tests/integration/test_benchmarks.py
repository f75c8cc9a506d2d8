"""The benchmarks run end to end and print the keys the docs quote (their numbers live in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def bench(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "freeride", "bench", *args, "--json"], capture_output=True,
                         text=True, timeout=240, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_control_benchmark_reports_hook_grant_and_revoke_latencies() -> None:
    r = bench("control", "--bubbles", "40", "--flood", "2000")
    for key in ("hook_us_p50", "hook_us_p99", "grant_us_p50", "grant_us_p99", "revoke_us_p50", "revoke_us_p99"):
        assert isinstance(r[key], float) and r[key] > 0, key
    assert r["events"] == 80
    # How many of the 40 bubbles got a window is a figure for docs/benchmarks.md, not a test's: a loaded
    # runner delays START edges and grows the overrun margin, and the agent rightly skips a bubble whose
    # window would open too late (CI once saw 35 of 40). The scheduler's unit tests pin the policy.
    assert 0 < r["windows"] <= 40
    assert r["events_total"] == 80 + 2000 and r["dropped_by_reporter"] == 0  # the whole flood reached the agent


def test_harvest_benchmark_reports_efficiency_against_the_ideal() -> None:
    r = bench("harvest", "--iterations", "5")
    assert 0 < float(r["efficiency"]) <= float(r["ideal_efficiency"]) <= 1  # type: ignore[arg-type]
    assert r["bubbles"] == 5 * 9  # stage 1 of 1F1B p=4 m=4: nine receive waits per iteration
    for key in ("bubble_s", "harvested_s", "overrun_fraction", "overrun_ms_p99", "prediction_error_p50"):
        assert key in r


def test_trainer_benchmark_alternates_plain_and_instrumented_steps() -> None:
    r = bench("trainer", "--microbatches", "4", "--iterations", "8")
    assert float(r["step_ms_plain"]) > 0 and float(r["step_ms_instrumented"]) > 0  # type: ignore[arg-type]
    assert 0.5 < float(r["overhead_ratio"]) < 2  # type: ignore[arg-type]
    assert [rank["bubbles_per_iteration"] for rank in r["ranks"]] == [7, 13, 11, 5]  # type: ignore[union-attr]

"""`freeride bench overhead`: refuses without CUDA; with --device cpu, the same replay runs as a labelled smoke test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KEYS = {"step_ms_plain", "step_ms_harvested", "slowdown", "harvested_s", "bubble_s", "efficiency",
        "trace_bubble_s", "efficiency_of_trace", "stop_after_end_ms_p50", "stop_after_end_ms_max", "neighbour",
        "neighbour_sleep_ghz"}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freeride", "bench", "overhead", "--json", *args],
                          capture_output=True, text=True, timeout=300)


def test_without_cuda_it_says_it_needs_a_gpu_in_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = _bench()
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.strip() == ("freeride: error: freeride bench overhead needs a CUDA GPU and none is visible; "
                                  "--device cpu runs it as a smoke test that is not representative")


@pytest.mark.serial  # the overhead bench times plain and harvested steps (the refusal above needs no quiet)
def test_on_cpu_the_replay_runs_and_is_labelled_not_representative() -> None:
    # Stage 0 of 4 waits (p-1)(F+B) per iteration: bubbles of several ms even for this small block.
    res = _bench("--device", "cpu", "-p", "4", "-m", "4", "--stage", "0", "--hidden", "256", "--seq", "64",
                 "--iterations", "10", "--side-task", "freeride.tooling.tasks:SleepTask", "--side-arg", "step_ms=1")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out.keys() >= KEYS
    assert out["representative"] is False and "not representative" in out["note"]
    assert (out["p"], out["m"], out["stage"], out["mps"]) == (4, 4, 0, "off")
    assert out["bubble_s"] > 0 and out["windows"] > 0
    assert 0 < out["harvested_s"] <= out["bubble_s"] * 1.05  # harvest never exceeds the bubbles it came from
    # Both seconds are rounded to 0.1 ms in the JSON (efficiency is computed before rounding): allow for that.
    rounding = 1e-4 / out["bubble_s"] + 1e-4
    assert out["efficiency"] == pytest.approx(out["harvested_s"] / out["bubble_s"], abs=rounding)
    # On CPU the neighbour is the CPU's own sleep, so the edges find the replay's gaps (each overshoots by a wake-up).
    assert (out["neighbour"], out["neighbour_sleep_ghz"]) == ("cpu", 0.0)
    assert out["trace_bubble_s"] <= out["bubble_s"] * 1.05 and out["bubble_s"] <= out["trace_bubble_s"] * 1.5

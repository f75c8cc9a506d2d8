"""`freeride gpu-check`: the CPU rehearsal (--fake-gpu) end to end, and how the runner isolates each check."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.paths import TASK_FILES

from freeride.tooling.gpucheck import registry, targets
from freeride.tooling.gpucheck.model import FAILED, PASSED, SKIPPED
from freeride.tooling.gpucheck.registry import CheckSpec
from freeride.tooling.gpucheck.runner import RunPlan, run_checks

HELPERS = TASK_FILES / "gpucheck_checks.py"
CUDA_ONLY = {"mps-mem-limit", "sidetasks", "overhead"}
MUST_PASS = {"environment", "doctor", "torch-hooks", "mps-daemon", "watchdog", "control", "harvest"}


def _gpu_check(*args: str, timeout_s: float = 110) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freeride", "gpu-check", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.CompletedProcess[str],
                                                                          dict[str, Any], Path]]:
    out = tmp_path_factory.mktemp("gpu-check")
    res = _gpu_check("--fake-gpu", "--out", str(out))
    report = json.loads((out / "gpu-check.json").read_text())
    yield res, report, out


def test_the_rehearsal_runs_every_check_and_exits_0(rehearsal: Any) -> None:
    res, report, _ = rehearsal
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == list(registry.NAMES)
    for c in checks.values():
        assert c["verdict"] in (PASSED, FAILED, SKIPPED)
        assert isinstance(c["duration_s"], float) and c["duration_s"] >= 0
        assert isinstance(c["details"], dict)
    assert report["mode"] == "fake" and report["ok"] is True
    assert report["counts"] == {PASSED: len(MUST_PASS), FAILED: 0, SKIPPED: len(CUDA_ONLY)}
    # one line per check on stdout, in order, between a header and a closing line
    lines = res.stdout.strip().splitlines()
    assert [ln.split()[1] for ln in lines[1:-1]] == list(registry.NAMES)
    assert "no check failed" in lines[-1]


def test_in_the_rehearsal_cuda_checks_are_skipped_saying_why_and_the_rest_pass(rehearsal: Any) -> None:
    _, report, _ = rehearsal
    checks = {c["name"]: c for c in report["checks"]}
    for name in CUDA_ONLY:
        assert checks[name]["verdict"] == SKIPPED
        assert "CUDA" in checks[name]["reason"]
    failing = {n: checks[n]["reason"] for n in MUST_PASS if checks[n]["verdict"] != PASSED}
    assert not failing
    # what each proved, in fake mode
    assert checks["mps-daemon"]["details"]["stand_in"] is True
    assert checks["mps-daemon"]["details"]["terminate_client_answer"] == ["0"]
    for phase in ("no-mps", "mps"):
        ran = checks["watchdog"]["details"]["phases"][phase]
        assert ran["task"]["reason"].startswith("memory_cap_exceeded")
        assert ran["agent_alive_after"] and ran["standin_ran_after"]
    assert checks["watchdog"]["details"]["phases"]["mps"]["terminate_client_before_kill"] is True
    assert checks["torch-hooks"]["details"]["holders"]
    names = {(t["check"], t["target"]) for t in report["targets"]}
    assert ("control", "hook p99 (µs)") in names and ("harvest", "grant p50 (µs)") in names


def test_the_summary_names_each_check_and_the_targets(rehearsal: Any) -> None:
    _, _, out = rehearsal
    md = (out / "gpu-check.md").read_text()
    for name in registry.NAMES:
        assert f"| {name} |" in md
    assert "## Targets" in md and "fake" in md
    assert (out / "gpu-check.log").exists()


def _spec(name: str, function: str, budget_s: float = 30.0, min_s: float = 1.0) -> CheckSpec:
    return CheckSpec(name, f"{HELPERS}:{function}", "a test check", budget_s=budget_s, fake_budget_s=budget_s,
                     min_s=min_s)


def test_a_hanging_check_is_killed_at_its_budget_with_what_it_started_and_the_next_check_runs() -> None:
    plan = RunPlan(fake=True, gpu=0, budget_s=60.0)
    results, _ = run_checks([_spec("hangs", "hang", budget_s=3.0), _spec("fine", "ok")], plan)
    hung, fine = results
    assert hung.verdict == FAILED
    assert hung.reason == "timed out after 3 s (its budget): killed with its process group"
    assert 3.0 <= hung.duration_s < 10.0
    assert "stray" in hung.details["output_tail"]
    stray = int(hung.details["output_tail"].split("stray ")[1].split()[0])
    assert stray in [p["pid"] for p in hung.details["left_running"]]  # it had left the process group
    assert not psutil.pid_exists(stray) or psutil.Process(stray).status() == psutil.STATUS_ZOMBIE
    assert (fine.verdict, fine.summary, fine.details["check"]) == (PASSED, "fine", "fine")


def test_a_crashing_check_fails_with_the_tail_of_its_traceback() -> None:
    results, _ = run_checks([_spec("crashes", "crash"), _spec("fine", "ok")], RunPlan(fake=True, gpu=0, budget_s=60))
    crashed, fine = results
    assert crashed.verdict == FAILED
    assert crashed.reason == "crashed (exit code 1): RuntimeError: boom: the check broke"
    assert "Traceback" in crashed.details["output_tail"]
    assert fine.verdict == PASSED


def test_a_check_that_no_longer_fits_the_budget_is_skipped_saying_so() -> None:
    results, _ = run_checks([_spec("big", "ok", min_s=100.0)], RunPlan(fake=True, gpu=0, budget_s=5.0))
    assert results[0].verdict == SKIPPED
    assert results[0].reason == "over the run's budget: needs at least 100 s, 5 s left of --budget-s 5"


def test_an_unknown_check_name_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    res = _gpu_check("--out", str(tmp_path), "--only", "environment,nope", timeout_s=60)
    assert res.returncode == 2
    assert res.stdout == ""
    err = res.stderr.strip().splitlines()
    assert len(err) == 1
    assert "argument --only: unknown check 'nope'; the checks are environment,doctor," in err[0]
    assert not (tmp_path / "gpu-check.json").exists()


def test_targets_are_read_from_every_run_a_benchmark_printed() -> None:
    result = {"slowdown": 0.001, "slowdown_interval": {"median": 0.001, "low": -0.002, "high": 0.004, "n": 37},
              "null": {"median": -0.001, "low": -0.003, "high": 0.002, "n": 36}, "useful_harvest": 0.75,
              "efficiency_of_trace": 0.9, "stop_after_end_ms_p99": 3.0,
              "with_mps": {"slowdown": 0.01, "slowdown_interval": {"median": 0.01, "low": 0.004, "high": 0.016},
                           "null": {"median": 0.005}, "efficiency_of_trace": 0.9, "useful_harvest": 0.5,
                           "stop_after_end_ms_p99": 1.0}}
    rows = {(r["run"], r["target"]): r["met"] for r in targets.measure("overhead", result)}
    assert rows == {
        (".", "slowdown"): True, ("with_mps", "slowdown"): False,
        (".", "slowdown 95 % interval, upper end"): True, ("with_mps", "slowdown 95 % interval, upper end"): False,
        (".", "A/A null |median|"): True, ("with_mps", "A/A null |median|"): False,
        # work done, not busy time: 90 % of the gaps busy is 50 % useful beside a neighbour that slows the steps
        (".", "useful harvest"): True, ("with_mps", "useful harvest"): False,
        (".", "stop after END p99 (ms)"): False, ("with_mps", "stop after END p99 (ms)"): True,
    }
    older = next(r for r in targets.measure("overhead", {"slowdown": 0.001}) if r["key"] == "null.median")
    assert (older["value"], older["met"]) == (None, None)  # a bench from before the interval: not measured
    control = {"runs": {"shm": {"hook_us_p99": 4.0, "hook_thread_cpu_us_per_edge": 30.0,
                                "floor_thread_cpu_us_per_edge": 25.0}}}
    cpu = next(r for r in targets.measure("control", control) if r["target"].startswith("trainer CPU"))
    assert (cpu["run"], cpu["value"], cpu["met"]) == ("runs.shm", 5.0, True)
    missing = next(r for r in targets.measure("control", control) if r["key"] == "grant_us_p50")
    assert (missing["value"], missing["met"]) == (None, None)

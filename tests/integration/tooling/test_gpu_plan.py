"""The prepared GPU plan (tools/gpu_plan.py), rehearsed on the CPU: the same commands, the GPU-only
configurations skipped each with its reason, every result kept where a device call brings it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.jitter import loaded_past_cores
from support.paths import REPO

ROOT = REPO
# Not serial: what is asserted is the plumbing (every file, field and row); the harvest's figures need a machine that
# gave the side task its bubbles, and the rehearsal says so (a skip naming the starved configurations) when not.


@pytest.mark.timeout(330)  # the plan's own 300 s, not the suite's 120: at twice the cores' load it ran past 120 s
def test_the_plan_rehearses_on_a_cpu_and_returns_what_finished(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "FREERIDE_PLAN_WORK": str(tmp_path / "work")}
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_plan.py"), "--device", "cpu", "--out", str(out),
                          "--iterations", "6", "--only", "A,B,T2"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    # what a device call brings back: at most 8 files, none deeper than two folders
    assert sorted(p.name for p in out.iterdir()) == ["plan.log", "plan.tar.gz", "probe.json", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    configs = summary["configs"]
    assert list(configs) == ["A-mps-wall-matmul", "A0-mps-wall-matmul-uncapped", "B-mps-gpu-matmul",
                             "T2-mps-wall-pagerank"]
    for gpu_only in ("A0-mps-wall-matmul-uncapped", "B-mps-gpu-matmul"):
        assert configs[gpu_only]["skipped"].startswith("needs CUDA")
    starved = []  # configurations the machine gave no side step to measure (said at the end, not failed on)
    for name in ("A-mps-wall-matmul", "T2-mps-wall-pagerank"):
        row = configs[name]
        loaded, figures = loaded_past_cores()
        if row["exit"] == 2 and "did not finish in" in row.get("error", "") and loaded:
            starved.append(f"{name}: {row['error']} ({figures})")  # the bench's one line, kept
            continue
        assert row["exit"] == 0, (name, row)
        assert set(row["slowdown_interval"]) == {"median", "low", "high", "n"}
        assert row["verdict"]
        if row["side_steps"] == 0 or row["solo_steps"] == 0:
            starved.append(f"{name}: {row['side_steps']} side and {row['solo_steps']} solo steps, {row['verdict']}")
            continue
        assert row["idle_step_ms"] > 0 and row["useful_harvest"] > 0
    if configs["A-mps-wall-matmul"]["exit"] != 0:  # refused for the load (any other exit failed above)
        pytest.skip("this machine is too loaded to run the rehearsal: " + "; ".join(starved))
    with tarfile.open(out / "plan.tar.gz") as tar:
        names = sorted(tar.getnames())
        assert names == ["A-mps-wall-matmul.json", "T2-mps-wall-pagerank.json"]  # each run's stdout, even empty
        full = json.load(tar.extractfile("A-mps-wall-matmul.json"))  # type: ignore[arg-type]
    run = full["runs"][0]  # the summary at the top; each configuration's rows in its run
    rows = run["rows"]
    assert [r["it"] for r in rows] == list(range(len(rows)))  # every iteration, the solo ones after the rest
    assert sum(r["solo"] for r in rows) == full["solo_iterations"]
    main = [r for r in rows if not r["solo"]]
    assert all(len(r["seg_ms"]) == len(main[0]["seg_ms"]) for r in main)
    assert run["windows_rows"], "the agent's windows, one row each"
    probe = json.loads((out / "probe.json").read_text())
    assert "capabilities" in probe
    if starved:  # every file and field is there; the figures need a machine that gave the side task its bubbles
        pytest.skip("this machine is too loaded to measure the rehearsal (plumbing checked): "
                    + "; ".join(starved))


def test_a_configuration_started_near_the_end_of_the_budget_is_not_cut_short(tmp_path: Path) -> None:
    # The budget decides whether a configuration starts, not how long it may run: on 2026-11-28 a third device
    # call gave its one configuration what was left of a 60 s budget, and killed it at 60 s of its 65.
    out = tmp_path / "out"
    env = {**os.environ, "FREERIDE_PLAN_WORK": str(tmp_path / "work")}
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_plan.py"), "--device", "cpu", "--out", str(out),
                          "--iterations", "4", "--only", "A-", "--no-probe", "--budget-s", "1", "--min-left-s", "0"],
                         env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    row = json.loads((out / "summary.json").read_text())["configs"]["A-mps-wall-matmul"]
    assert row["exit"] == 0 and row["elapsed_s"] > 1, row


def test_a_bench_that_fails_leaves_its_one_line_in_the_summary_and_stops_the_plan(tmp_path: Path) -> None:
    # An import check with no time to finish: the bench's submit is refused, as a loaded machine refused it in the
    # rehearsal of 2026-11-29, where the summary said only "no JSON from the bench (exit 2): JSONDecodeError".
    out = tmp_path / "out"
    env = {**os.environ, "FREERIDE_PLAN_WORK": str(tmp_path / "work"), "FREERIDE_CHECK_TIMEOUT_S": "0.01"}
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_plan.py"), "--device", "cpu", "--out", str(out),
                          "--iterations", "4", "--only", "A-", "--no-probe"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1 and "the plan stops here" in res.stdout + res.stderr
    row = json.loads((out / "summary.json").read_text())["configs"]["A-mps-wall-matmul"]
    assert row["exit"] == 2
    assert row["error"].startswith("no JSON from the bench (exit 2): freeride: error: importing "), row
    assert "did not finish in 0.01 s" in row["error"]

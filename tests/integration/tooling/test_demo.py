"""`freeride demo --quick`, run as a user runs it: a subprocess with real agents, workers and training ranks.

Every process the demo starts (agents, side-task workers, training ranks) inherits a marker in its
environment, so the tests can find any that outlive the demo, however deep they were started.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.cli import clean_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# On a CPU one stage per core (the demo's stand-in for one GPU per stage), four at most.
STAGES = min(4, len(os.sched_getaffinity(0)))
REPORT_KEYS = {"config", "training_s", "step_ms", "slowdown", "loss", "bubble_s", "harvested_s", "efficiency",
               "stages", "tasks", "timeline_png", "profile", "report_json", "wall_s"}


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries `mark`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FREERIDE_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Demo:
    """The demo as a child process; its stderr lines arrive on a queue as they are printed."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.mark = uuid.uuid4().hex
        self.out = tmp_path / "out"
        env = clean_env(columns="200", FREERIDE_TEST_MARK=self.mark, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            # One side task per stage (not every task on every stage): the same code paths, half the start-up.
            # Workers at normal CPU priority: on a loaded CI runner, low-priority ones may get no CPU at all.
            [sys.executable, "-m", "freeride", "demo", "--quick", "--placement", "spread", "--worker-nice", "0",
             "--worker-sched", "other", "--json", "--out", str(self.out), *args],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._stdout: list[str] = []
        # One reader per pipe, and nothing else reads them (communicate() would race the stderr reader
        # for the last lines).
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_stdout, daemon=True)]
        for r in self._readers:
            r.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self._stdout.append(self.proc.stdout.read())

    def wait_for_line(self, text: str, timeout_s: float) -> str:
        while True:
            line = self.lines.get(timeout=timeout_s)  # raises queue.Empty: a hang, not a slow machine
            assert line is not None, f"the demo ended before printing {text!r}:\n{''.join(self.stderr)}"
            if text in line:
                return line

    def finish(self, timeout_s: float) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout_s)
        for r in self._readers:
            r.join(timeout=10)  # EOF once the demo and everything it started have closed the pipes
        return code, "".join(self._stdout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in _marked(self.mark):
            p.kill()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[type[Demo]]:
    started: list[Demo] = []

    def start(*args: str) -> Demo:
        d = Demo(tmp_path, *args)
        started.append(d)
        return d

    yield start  # type: ignore[misc]
    for d in started:
        d.kill()


# Serial, though it judges no figure of the machine (the slowdown within (-1, 10), some harvest on each stage, the loss
# down): its ~50 CPU-seconds cost the parallel phase about what they save the serial one (tried 2026-11-29), and
# alone it never competes with other tests for its stages' cores.
@pytest.mark.serial
@pytest.mark.timeout(240)
def test_quick_demo_trains_harvests_every_stage_reports_and_leaves_nothing_behind(demo):
    d = demo("--blocks", "2")  # one baseline block and one harvest block: every part of the report, 6 iterations less
    code, stdout = d.finish(timeout_s=200)
    assert code == 0, "".join(d.stderr)[-4000:]
    report = json.loads(stdout)
    assert report.keys() >= REPORT_KEYS
    assert _marked(d.mark) == [], "processes outlived the demo"

    # Training really trained, and was timed both ways in the same run.
    assert report["loss"]["last"] < report["loss"]["first"]
    steps = report["step_ms"]
    assert steps["baseline"] and steps["harvest"]
    assert steps["baseline_median"] > 0 and steps["harvest_median"] > 0
    assert report["slowdown_of_medians"] == pytest.approx(steps["harvest_median"] / steps["baseline_median"] - 1,
                                                          abs=1e-3)
    assert -1 < report["slowdown"] < 10

    # Each stage had bubbles, and side tasks used part of them; each task moved on.
    assert len(report["stages"]) == STAGES
    assert report["config"]["cpus"] == sorted(os.sched_getaffinity(0))[:STAGES]
    for stage in report["stages"]:
        assert stage["bubble_s"] > 0 and stage["harvested_s"] > 0, stage
        assert 0 < stage["efficiency"] <= 1
        for name, task in stage["tasks"].items():
            assert task["steps"] > 0, (stage["stage"], name)
            assert task["progress"], (stage["stage"], name)
            assert any(v["end"] != v["start"] for v in task["progress"].values()), (stage["stage"], name, task)
    assert report["harvested_s"] == pytest.approx(sum(s["harvested_s"] for s in report["stages"]), abs=0.01)

    # The files a user is pointed to.
    png = Path(report["timeline_png"])
    assert png.parent == d.out and png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 20_000
    profile = report["profile"]  # the pipeline's bubble profile, as `freeride profile --from` reads it
    assert Path(profile["png"]).read_bytes().startswith(PNG_MAGIC)
    assert [p["rank"] for p in profile["stages"]] == list(range(STAGES))
    assert all(p["slots"] and p["bubble_fraction"] > 0 for p in profile["stages"])
    again = subprocess.run([sys.executable, "-m", "freeride", "profile", "--from", profile["json"], "--json"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert [p["bubble_fraction"] for p in json.loads(again.stdout)["stages"]] == \
        [p["bubble_fraction"] for p in profile["stages"]]
    assert json.loads(Path(report["report_json"]).read_text()) == report


# Judged by its exit and the processes left (none), its deadlines generous: 90 s to start training (~20 s alone),
# 30 s to stop (~2 s).
@pytest.mark.background
@pytest.mark.timeout(120)
def test_ctrl_c_mid_run_stops_every_process_and_exits_promptly(demo):
    d = demo()
    d.wait_for_line("iteration 1:", timeout_s=90)  # training is running: ranks, agents and workers are all up
    running = _marked(d.mark)
    # the demo, an agent, a worker or more and a rank per stage
    assert len(running) >= 1 + 3 * STAGES, [p.cmdline()[:5] for p in running]
    d.proc.send_signal(signal.SIGINT)
    code, stdout = d.finish(timeout_s=30)
    stderr = "".join(d.stderr)
    assert code == 130, stderr[-4000:]
    assert stdout == ""
    assert "Traceback" not in stderr, stderr[-4000:]
    assert "interrupted: every process the demo started has been stopped" in stderr.splitlines()[-1], stderr[-2000:]
    assert _marked(d.mark) == [], "processes outlived the interrupted demo"


@pytest.mark.parametrize(("argv", "words"), [
    (["--blocks", "3"], ["--blocks must be even"]),
    (["--stages", "1"], ["--stages must be between 2 and 8"]),
    (["--out", "."], ["exists and is not empty"]),
])
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, argv, words):
    _refused(tmp_path, argv, words)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) >= 8, reason="every stage count the demo takes fits these cores")
def test_on_a_cpu_more_stages_than_cores_is_refused(tmp_path):
    cores = len(os.sched_getaffinity(0))
    _refused(tmp_path, ["--stages", str(cores + 1)], [f"--stages {cores + 1}", "needs a core of its own"])


def _refused(tmp_path, argv, words):
    (tmp_path / "something").write_text("")
    res = subprocess.run([sys.executable, "-m", "freeride", "demo", *argv], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.splitlines()
    assert all(w in line for w in words), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["something"]  # no output directory either

"""A trainer stand-in: a process that computes (matmuls on the GPU, or a sleep on the CPU) and reports a bubble
between computes, like one pipeline rank. The checks use it as the synthetic trainer that feeds an agent and as
the "training job" that must keep running while side tasks misbehave beside it.

    python -m freeride.tooling.gpucheck.standin '{"target": "unix:/…/agent.sock", "device": "cuda", ...}'

It prints `ready <pid>` once it holds its GPU memory and its reporter is connected, then `it <n> <matmuls>`
after every iteration, and stops at SIGTERM. `StandIn` runs it and follows those lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride.tooling.gpucheck import procs

DEFAULTS: dict[str, Any] = {"target": "", "device": "cpu", "gpu": 0, "bubble_ms": 20.0, "compute_ms": 10.0,
                            "hold_mib": 0, "size": 2048}


class StandInError(RuntimeError):
    """The stand-in did not come up."""


class StandIn:
    """The stand-in process, followed line by line from a reader thread (no polling)."""

    def __init__(self, plan: Mapping[str, Any], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.plan = {**DEFAULTS, **plan}
        self.log_path = log_path
        self._env = procs.child_env(env)
        self._cond = threading.Condition()
        self.iterations = 0
        self.matmuls = 0
        self.pid = 0
        self._ready = False
        self._ended = False
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float) -> StandIn:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "freeride.tooling.gpucheck.standin", json.dumps(self.plan)],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True, env=self._env,
            )
        self.pid = self.proc.pid
        threading.Thread(target=self._read, daemon=True).start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._ended, timeout_s)
            ok, ended = self._ready, self._ended
        if not ok:
            code = self.stop()["exit_code"]
            what = f"exited (code {code}) before it was ready" if ended else f"was not ready in {timeout_s:.0f} s"
            raise StandInError(f"the trainer stand-in {what}: {procs.last_line(self.log_tail()) or 'no output'}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            with self._cond:
                if parts[:1] == ["ready"]:
                    self._ready = True
                elif parts[:1] == ["it"] and len(parts) == 3:
                    self.iterations, self.matmuls = int(parts[1]) + 1, int(parts[2])
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def wait_iterations(self, more: int, timeout_s: float) -> bool:
        """Block until `more` further iterations have run; False if it stopped or the time ran out first."""
        with self._cond:
            goal = self.iterations + more
            self._cond.wait_for(lambda: self.iterations >= goal or self._ended, timeout_s)
            return self.iterations >= goal

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return procs.tail(self.log_path.read_text(errors="replace"), lines=10)
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """SIGTERM, then what it did: iterations, matmuls, exit code (None: it had to be killed)."""
        code: int | None = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return {"pid": self.pid, "iterations": self.iterations, "matmuls": self.matmuls, "exit_code": code,
                "stderr_tail": self.log_tail()}

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the stand-in process ------------------------------------------------------------------------------
class _Compute:
    """Matmuls on the GPU for `compute_ms` (synchronised, so the time is GPU time), or a sleep on the CPU."""

    def __init__(self, plan: Mapping[str, Any]) -> None:
        self.seconds = float(plan["compute_ms"]) / 1e3
        self.count = 0
        self.cuda = plan["device"] == "cuda"
        if self.cuda:
            import torch

            self.torch = torch
            self.dev = torch.device(f"cuda:{int(plan['gpu'])}")
            n = int(plan["size"])
            self.hold = torch.ones(int(plan["hold_mib"]) * 2**20, dtype=torch.uint8, device=self.dev)
            self.a = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            self.b = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            self.scale = 1.0 / n
            self.run()

    def run(self) -> None:
        if not self.cuda:
            time.sleep(self.seconds)
            return
        end = time.perf_counter() + self.seconds
        while True:
            self.a = (self.a @ self.b) * self.scale
            self.torch.cuda.synchronize(self.dev)
            self.count += 1
            if time.perf_counter() >= end:
                return


def main(argv: list[str]) -> int:
    plan = {**DEFAULTS, **json.loads(argv[0])}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    compute = _Compute(plan)
    reporter = None
    if plan["target"]:
        from freeride.trainer.reporter import BubbleReporter

        reporter = BubbleReporter(plan["target"], rank=0)
        if not reporter.wait_connected(10):
            print("error: the reporter could not connect to the agent", file=sys.stderr)
            return 3
    print(f"ready {os.getpid()}", flush=True)
    bubble_s = float(plan["bubble_ms"]) / 1e3
    it = 0
    try:
        while not stop.is_set():
            if reporter is not None:
                reporter.set_iteration(it)
            compute.run()
            if reporter is not None:
                reporter.start(0, expected_duration_ns=int(bubble_s * 1e9))
            time.sleep(bubble_s)
            if reporter is not None:
                reporter.end(0)
            print(f"it {it} {compute.count}", flush=True)
            it += 1
    finally:
        if reporter is not None:
            reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

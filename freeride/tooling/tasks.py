"""Synthetic side tasks for the benchmarks: a known step time, nothing else."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from freeride import IterativeTask, PoolItem, PoolTask


class SleepTask(IterativeTask):
    """Each step takes step_ms ± jitter_ms of wall time without using a CPU (like a GPU kernel)."""

    def __init__(self, step_ms: float = 5.0, jitter_ms: float = 0.0, seed: int = 0) -> None:
        self.step_s = step_ms / 1e3
        self.jitter_s = jitter_ms / 1e3
        self.rng = random.Random(seed)
        self.steps = 0

    def step(self) -> None:
        time.sleep(max(0.0, self.step_s + self.rng.uniform(-self.jitter_s, self.jitter_s)))
        self.steps += 1

    def progress(self) -> Mapping[str, float]:
        return {"steps": float(self.steps)}


class NoopTask(IterativeTask):
    """Tiny steps that leave the CPU free, like a short GPU kernel: measures the framework, not the task."""

    def __init__(self, step_us: float = 50.0) -> None:
        self.step_s = step_us / 1e6

    def step(self) -> None:
        time.sleep(self.step_s)


class BallastTask(IterativeTask):
    """Holds `mb` MiB of touched host memory in its worker and in each of `children` child processes (a
    data-loader's shape): a resident task whose memory the watchdog samples each tick. Its steps are no-ops."""

    def __init__(self, mb: int = 256, children: int = 0, step_us: float = 50.0) -> None:
        self.nbytes = mb * 2**20
        self.children = children
        self.step_s = step_us / 1e6
        self._procs: list[subprocess.Popen[bytes]] = []

    def setup(self) -> None:
        self._ballast = touched(self.nbytes)
        n = self.nbytes
        hold = (f"import sys; b = bytearray({n}); b[::4096] = b'x' * len(range(0, {n}, 4096)); "
                "sys.stdout.write('held\\n'); sys.stdout.flush(); sys.stdin.read()")
        for _ in range(self.children):  # each exits at its stdin's end of file: when this worker is gone
            self._procs.append(subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE))
        for proc in self._procs:
            assert proc.stdout is not None
            proc.stdout.readline()  # its memory is held

    def step(self) -> None:
        time.sleep(self.step_s)

    def teardown(self) -> None:
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()


def touched(nbytes: int) -> bytearray:
    """`nbytes` of memory with one byte of every page written: resident, not a lazily mapped zero page, at one
    page fault a page (the synthetic tasks that hold or grow memory use it)."""
    buf = bytearray(nbytes)
    buf[::4096] = b"\x01" * len(range(0, nbytes, 4096))
    return buf


class MatmulTask(IterativeTask):
    """A synthetic GPU (or CPU) task: each step is square matmuls sized to take about step_ms, then a sync,
    so a step's end is when its kernels are done (what bounds an overrun)."""

    def __init__(self, step_ms: float = 5.0, size: int = 2048, device: str = "") -> None:
        self.step_s = step_ms / 1e3
        self.size = size
        self.device = device
        self.repeats = 1
        self.steps = 0

    def setup(self) -> None:
        import torch

        self._torch = torch
        self._dev = torch.device(self.device or self.context.device)
        if self._dev.type == "cpu":
            torch.set_num_threads(1)  # leave the trainer its cores
        dtype = torch.bfloat16 if self._dev.type == "cuda" else torch.float32
        self._a = torch.randn(self.size, self.size, device=self._dev, dtype=dtype)
        self._b = torch.randn(self.size, self.size, device=self._dev, dtype=dtype)
        self._run(3)  # warm up, then size the step
        t0 = time.perf_counter()
        self._run(5)
        per = (time.perf_counter() - t0) / 5
        self.repeats = max(1, round(self.step_s / per)) if per > 0 else 1

    def _run(self, n: int) -> None:
        for _ in range(n):
            self._a = (self._a @ self._b) * (1.0 / self.size)
        if self._dev.type == "cuda":
            self._torch.cuda.synchronize(self._dev)

    def step(self) -> None:
        self._run(self.repeats)
        self.steps += 1

    def progress(self) -> Mapping[str, float]:
        return {"steps": float(self.steps), "matmuls_per_step": float(self.repeats)}


class FilePool(PoolTask):
    """A pool task for tests and `bench pool`: item i writes `out_dir/i` holding its id, after `work_us` of CPU
    (or, with `cpu=False`, of sleep: a GPU kernel's wait, which leaves the CPU free).

    An item whose args say {"poison": true} raises (it ends in the dead letters). Each call to
    process() appends the id to `out_dir/.processed-<consumer>`, so a test can tell how often an item ran.
    `max_step_ms` (> 0) replaces PoolTask's longest planned step.
    """

    def __init__(self, pool: str, out_dir: str, work_us: float = 0.0, sync: bool = False,
                 max_step_ms: float = 0.0, cpu: bool = True) -> None:
        super().__init__(pool)
        self.out_dir = Path(out_dir)
        self.work_s = work_us / 1e6
        self.sync = sync
        self.cpu = cpu
        if max_step_ms > 0:
            self.max_step_s = max_step_ms / 1e3

    def setup(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = self.consumer.replace("/", "_")
        self._journal = open(self.out_dir / f".processed-{name}", "a", buffering=1)  # noqa: SIM115 - closed in teardown

    def process(self, item: PoolItem) -> None:
        self._journal.write(f"{item.id}\n")
        if item.args.get("poison"):
            raise ValueError(f"item {item.id} is poison")
        if self.cpu:
            end = time.perf_counter() + self.work_s
            while time.perf_counter() < end:
                pass
        elif self.work_s > 0:
            time.sleep(self.work_s)
        out = self.out_dir / item.id
        tmp = self.out_dir / f".{item.id}.{os.getpid()}.tmp"  # a worker that took over the item writes its own
        with open(tmp, "w") as f:
            f.write(item.id)
            if self.sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, out)

    def teardown(self) -> None:
        super().teardown()
        self._journal.close()

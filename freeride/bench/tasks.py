"""Synthetic side tasks for the benchmarks: a known step time, nothing else."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping

from freeride import IterativeTask


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

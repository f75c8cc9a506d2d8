"""Side tasks for gpu-check: memory that grows on purpose, on the GPU or (fake GPU) in resident memory."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride import IterativeTask
from freeride.tooling.tasks import touched

_MiB = 2**20
_ENV = ("CUDA_VISIBLE_DEVICES", "FREERIDE_DEVICE")  # beside CUDA_MPS_*: what the agent gave the worker


class GrowingHog(IterativeTask):
    """Each step (at least `step_ms` long) allocates `step_mib` more, touched, until `max_mib`, then holds.

    `device="cuda"` allocates GPU memory past the torch memory fraction the worker set from the task's cap
    (setup raises it to 1.0), so what stops the task is MPS's pinned limit or the agent's watchdog, not
    PyTorch. `device="cpu"` allocates resident memory (what the fake GPU counts). At `hold_mib` it holds
    for `hold_steps` steps first: a plateau below the cap for an observer to sample. After every step it
    writes {"pid", "allocated_mib", "phase", "error", "env"} to `marker` (if given; env: the CUDA_MPS_*
    settings the worker got); an allocation that fails is written there before the error ends the step.
    """

    def __init__(self, step_mib: int = 8, step_ms: float = 5.0, max_mib: int = 4096, hold_mib: int = 0,
                 hold_steps: int = 0, device: str = "cpu", marker: str = "") -> None:
        self.step_mib, self.step_s, self.max_mib = step_mib, step_ms / 1e3, max_mib
        self.hold_mib, self.hold_steps = hold_mib, hold_steps
        self.device = device
        self.marker = Path(marker) if marker else None
        self.held: list[Any] = []
        self.allocated_mib = 0
        self.phase = "growing"

    def setup(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            self._torch = torch
            dev = torch.device(self.device)  # "cuda" has no index, which the memory fraction needs
            self._dev = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_per_process_memory_fraction(1.0, self._dev)
            torch.ones(1, device=self._dev)  # the context exists before the first step
        self._write()

    def step(self) -> None:
        t0 = time.perf_counter()
        if self.hold_mib and self.allocated_mib >= self.hold_mib and self.hold_steps > 0:
            self.hold_steps -= 1
            self.phase = "holding"
        elif self.allocated_mib + self.step_mib <= self.max_mib:
            self.phase = "growing"
            try:
                self.held.append(self._allocate(self.step_mib * _MiB))
            except Exception as exc:  # the out-of-memory error is the evidence: written down, then raised
                self._write(f"{type(exc).__name__}: {exc}")
                raise
            self.allocated_mib += self.step_mib
        else:
            self.phase = "at max"
        self._write()
        left = self.step_s - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    def _allocate(self, size: int) -> Any:
        if self.device.startswith("cuda"):
            tensor = self._torch.ones(size, dtype=self._torch.uint8, device=self._dev)
            self._torch.cuda.synchronize(self._dev)
            return tensor
        return touched(size)

    def _write(self, error: str = "") -> None:
        if self.marker is None:
            return
        tmp = self.marker.with_suffix(".tmp")
        env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_") or k in _ENV}
        tmp.write_text(json.dumps({"pid": os.getpid(), "allocated_mib": self.allocated_mib, "phase": self.phase,
                                   "error": error, "env": env}))
        os.replace(tmp, self.marker)

    def progress(self) -> Mapping[str, float]:
        return {"allocated_mib": float(self.allocated_mib)}

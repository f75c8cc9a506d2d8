"""What the agent needs from one GPU, as a small protocol with a real (NVML) and a fake implementation.

The agent never imports pynvml itself: it opens a `Device` here and, when there is no GPU or no
driver, runs in CPU mode (host memory stands in for GPU memory, see `HostProbe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from freeride.errors import FreerideError

COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class GpuError(FreerideError):
    """A GPU query failed; the message says what and how to fix it."""


class NoGpuError(GpuError):
    """No usable GPU here (no driver, no NVML, no device with that index): run in CPU mode."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    uuid: str
    name: str
    total_bytes: int


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    free_bytes: int
    used_bytes: int


class Device(Protocol):
    """One GPU as the agent sees it."""

    kind: str  # "nvml" or "fake"
    info: DeviceInfo

    def memory(self) -> MemoryInfo:
        """Device-wide memory now (NVML: nvmlDeviceGetMemoryInfo)."""
        ...

    def process_memory(self) -> dict[int, int]:
        """GPU memory per process id now; processes the driver reports no figure for are left out."""
        ...

    def compute_mode(self) -> str:
        """One of COMPUTE_MODES' names, or "UNKNOWN"."""
        ...

    def add_client(self, pid: int) -> None:
        """A worker process was started on this GPU (the fake attributes memory to it; NVML sees it itself)."""
        ...

    def close(self) -> None: ...


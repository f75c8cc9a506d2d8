"""The GPU layer: device queries (NVML or a fake), memory probes and MPS control.

CPU mode (no GPU, no driver) is a first-class mode: `HostProbe` measures the host memory a worker's
task really holds (its cgroup's memory.current, else PSS) so memory caps are enforced the same way on a
machine without a GPU.
"""

from __future__ import annotations

from freeride.gpu.device import Device, DeviceInfo, GpuError, MemoryInfo, NoGpuError
from freeride.gpu.open import open_device
from freeride.gpu.probe import DeviceProbe, HostProbe, MemoryProbe

__all__ = [
    "Device",
    "DeviceInfo",
    "DeviceProbe",
    "GpuError",
    "HostProbe",
    "MemoryInfo",
    "MemoryProbe",
    "NoGpuError",
    "open_device",
]

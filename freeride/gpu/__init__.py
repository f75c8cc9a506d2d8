"""The GPU layer: device queries (NVML or a fake), memory probes and MPS control.

CPU mode (no GPU, no driver) is a first-class mode: `RssProbe` measures a worker's resident
memory so memory caps are enforced the same way on a machine without a GPU.
"""

from __future__ import annotations

from freeride.gpu.device import Device, DeviceInfo, GpuError, MemoryInfo, NoGpuError
from freeride.gpu.open import open_device
from freeride.gpu.probe import DeviceProbe, MemoryProbe, RssProbe

__all__ = [
    "Device",
    "DeviceInfo",
    "DeviceProbe",
    "GpuError",
    "MemoryInfo",
    "MemoryProbe",
    "NoGpuError",
    "RssProbe",
    "open_device",
]

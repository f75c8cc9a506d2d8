"""Pick the device behind the GPU layer: the shipped fake when a spec is given, else NVML."""

from __future__ import annotations

from freeride.gpu.device import Device
from freeride.gpu.fake import FakeDevice
from freeride.gpu.nvml import NvmlDevice


def open_device(index: int, fake_spec: str = "") -> Device:
    """The fake when a spec is given, else NVML; raises NoGpuError when there is no GPU to use."""
    if fake_spec:
        return FakeDevice.from_spec(index, fake_spec)
    return NvmlDevice.open(index)

"""How much memory each worker holds: the watchdog's one question, asked once per sample for all workers.

CPU mode (`RssProbe`) answers with resident set sizes; on a GPU (`DeviceProbe`) with the device's
per-process memory. Either way a worker's figure includes what it forked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import psutil

from freeride.gpu.device import Device


class MemoryProbe(Protocol):
    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        """Bytes each worker (root pid) and its descendants hold on this device; 0 for a worker that is gone."""
        ...


def process_tree(pid: int) -> list[int]:
    """The process and its descendants; empty if it is gone."""
    try:
        root = psutil.Process(pid)
        return [pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.Error:
        return []


def rss_bytes(pid: int) -> int:
    """Resident set size of a process and its descendants; 0 if it is gone."""
    total = 0
    for p in process_tree(pid):
        try:
            total += psutil.Process(p).memory_info().rss
        except psutil.Error:
            continue
    return total


class RssProbe:
    """CPU mode: resident memory stands in for device memory."""

    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        return {pid: rss_bytes(pid) for pid in pids}


class DeviceProbe:
    """GPU mode: one per-process query to the device per sample, summed over each worker's process tree."""

    def __init__(self, device: Device) -> None:
        self._device = device

    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        per_pid = self._device.process_memory()
        return {pid: sum(per_pid.get(p, 0) for p in process_tree(pid)) for pid in pids}

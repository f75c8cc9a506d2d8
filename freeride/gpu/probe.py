"""How much memory each worker holds: the watchdog's one question, asked once per sample for all workers.

CPU mode (`HostProbe`) answers with what the task really holds in host memory: its worker cgroup's
`memory.current` where the worker has a group of its own with memory accounting, else the proportional
set size (PSS) of its process tree, where a page shared by n processes counts 1/n to each, so a forked
child's copy-on-write pages are counted once, not once per process as resident set sizes would. On a GPU
(`DeviceProbe`) it is the device's per-process memory. Either way a worker's figure includes what it forked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
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
    """Resident set size of a process and its descendants; 0 if it is gone. (Shared pages count once per
    process: the fake GPU's stand-in for device memory, which processes do not share.)"""
    total = 0
    for p in process_tree(pid):
        try:
            total += psutil.Process(p).memory_info().rss
        except psutil.Error:
            continue
    return total


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process and its descendants (one /proc/PID/smaps_rollup read each); 0 if
    it is gone. Never more than the memory the tree holds, however many processes share its pages."""
    total = 0
    for p in process_tree(pid):
        try:
            total += psutil.Process(p).memory_full_info().pss
        except psutil.Error:
            continue
    return total


def cgroup_bytes(group: Path) -> int | None:
    """The group's memory.current (its processes and sub-groups, page cache included); None without memory
    accounting there."""
    try:
        return int((group / "memory.current").read_text())
    except (OSError, ValueError):
        return None


class HostProbe:
    """CPU mode: host memory stands in for device memory; a worker counts what its task really holds.

    `group_of(pid)`: the worker's own cgroup (None: it has none); set by the agent once it knows its
    worker containment (GpuControl.count_groups)."""

    def __init__(self, group_of: Callable[[int], Path | None] | None = None) -> None:
        self.group_of = group_of

    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        return {pid: self.bytes_of(pid) for pid in pids}

    def bytes_of(self, pid: int) -> int:
        group = self.group_of(pid) if self.group_of is not None else None
        in_group = cgroup_bytes(group) if group is not None else None
        return in_group if in_group is not None else pss_bytes(pid)


class DeviceProbe:
    """GPU mode: one per-process query to the device per sample, summed over each worker's process tree."""

    def __init__(self, device: Device) -> None:
        self._device = device

    def usage(self, pids: Iterable[int]) -> dict[int, int]:
        per_pid = self._device.process_memory()
        return {pid: sum(per_pid.get(p, 0) for p in process_tree(pid)) for pid in pids}

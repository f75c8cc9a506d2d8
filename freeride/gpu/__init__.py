"""What the agent needs to know about memory use on its device.

CPU mode (this module's `RssProbe`) measures a worker's resident memory, itself and its
children, so memory caps are enforced the same way on a machine without a GPU. The NVML
implementation (per-process GPU memory) is the GPU layer's, behind the same protocol.
"""

from __future__ import annotations

from typing import Protocol

import psutil

__all__ = ["MemoryProbe", "RssProbe"]


class MemoryProbe(Protocol):
    def process_bytes(self, pid: int) -> int:
        """Memory the process (and what it forked) holds on this device; 0 if it is gone."""
        ...


class RssProbe:
    """Resident set size of a process and its descendants (CPU mode)."""

    def process_bytes(self, pid: int) -> int:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

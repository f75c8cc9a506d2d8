"""Where the worker runs and what it may take: the CPU placement the agent chose (nice, CPUs, scheduling class),
the GPU index it was given, and PyTorch's caching allocator capped at the task's memory cap."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from freeride.core.cpu import apply_from_env

log = logging.getLogger("freeride.worker")


def gpu_index(environ: Mapping[str, str] | None = None) -> int:
    """FREERIDE_GPU as the agent set it (its --gpu); -1 when absent or not a number (a worker started by hand)."""
    return env_int((os.environ if environ is None else environ).get("FREERIDE_GPU", ""), -1)


def env_int(raw: str, default: int = 0) -> int:
    try:
        return int(raw)
    except ValueError:
        return default


def apply_cpu_placement() -> bool:
    """The CPU placement the agent chose (--worker-nice/-cpus/-sched), applied before the task starts anything."""
    problem = apply_from_env(os.environ)
    if problem:
        log.error("cannot run at the CPU placement the agent chose: %s", problem)
    return not problem


_torch_limited = False


def limit_torch_memory(cap_bytes: int, device: str, before_setup: bool) -> None:
    """Cap PyTorch's caching allocator at the task's memory cap (a second line behind MPS's pinned limit).

    Before setup only when the agent put the worker on a GPU (importing torch costs a second);
    after setup for any task that initialised CUDA itself. The MPS client settings are already in
    the environment (the agent spawned the worker with them), so creating the context here is safe.
    """
    global _torch_limited
    if cap_bytes <= 0 or _torch_limited:
        return
    if before_setup and not device.startswith("cuda"):
        return
    torch: Any = sys.modules.get("torch")
    if torch is None:
        if not before_setup:
            return
        try:
            import torch
        except ImportError:
            return
    if not torch.cuda.is_available() or (not before_setup and not torch.cuda.is_initialized()):
        return
    index = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), index)
    _torch_limited = True
    log.info("torch memory fraction on cuda:%d set to %.3f (cap %d MiB)", index, cap_bytes / total, cap_bytes >> 20)

"""What the integrations need from CUDA at bubble edges (nothing at all on CPU)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def stream_sync(device: Any, enabled: bool | None = None) -> Callable[[], None] | None:
    """Synchronise the current stream of a CUDA device; None for CPU devices or when disabled."""
    if enabled is False or getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return lambda: torch.cuda.current_stream(device).synchronize()


def free_memory(device: Any) -> Callable[[], int] | None:
    """Bytes the trainer leaves free on its GPU: total minus the peak its allocator reserved."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    return lambda: int(total - torch.cuda.max_memory_reserved(device))

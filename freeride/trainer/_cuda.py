"""What the integrations read from CUDA (nothing at all on CPU); the bubble edges are in _edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def on_cuda(device: Any) -> bool:
    """Whether a stage's device is a CUDA one (a torch.device, or None: CPU)."""
    return getattr(device, "type", "cpu") == "cuda"


def free_memory(device: Any) -> Callable[[], int] | None:
    """Bytes the trainer leaves free on its GPU: total minus the peak its allocator reserved."""
    if not on_cuda(device):
        return None
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    return lambda: int(total - torch.cuda.max_memory_reserved(device))

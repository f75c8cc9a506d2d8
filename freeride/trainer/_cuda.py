"""What the integrations read from CUDA (nothing at all on CPU), and whether a stage's sends block; the bubble
edges are in edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def on_cuda(device: Any) -> bool:
    """Whether a stage's device is a CUDA one (a torch.device, or None: CPU)."""
    return getattr(device, "type", "cpu") == "cuda"


def sends_block(device: Any) -> bool:
    """Whether a stage's sends wait for the neighbour: on a CPU stage (gloo) a send blocks until the neighbour takes
    the data, idle time like a receive's, so it is timed. On CUDA an NCCL send is queued on the stream and returns
    at once: a hook there would time nothing and, with `stream` edges, synchronise the stream twice a send."""
    return not on_cuda(device)


def free_memory(device: Any) -> Callable[[], int] | None:
    """Bytes the trainer leaves free on its GPU: total minus the peak its allocator reserved."""
    if not on_cuda(device):
        return None
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    return lambda: int(total - torch.cuda.max_memory_reserved(device))

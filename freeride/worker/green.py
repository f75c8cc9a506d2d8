"""A side task's kernels in a CUDA green context of N SMs (the agent's --green-sms): the SMs it can occupy are
bounded by the hardware, so a bubble's END finds at most N SMs held by side-task work.

torch exposes green contexts from 2.10 (`torch.cuda.green_contexts.GreenContext.create(num_sms=..., device_id=...)`,
`set_context()`, which also makes the context's stream the current one); the H200 run of 2026-11-28 found
`create(num_sms=16)` working on torch 2.11 with driver 580 (docs/benchmarks.md, "Second GPU run"). Whether it
composes with MPS is not measured yet. Anything missing or refused is one log line, and the task runs in the
ordinary context: a cap that cannot be set must not stop a task.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_entered: list[Any] = []  # the context entered: kept alive for the worker's life


def enter(num_sms: int, device: str, torch: Any = None) -> str:
    """Make a green context of `num_sms` SMs current on `device` (a "cuda:N" string) for this thread; what was
    done, for the log ("" when nothing was asked: num_sms <= 0 or a CPU device)."""
    if num_sms <= 0 or not device.startswith("cuda"):
        return ""
    try:
        if torch is None:
            import torch
        gc = getattr(getattr(torch.cuda, "green_contexts", None), "GreenContext", None)
        if gc is None:
            return f"--green-sms {num_sms} ignored: torch {torch.__version__} has no torch.cuda.green_contexts"
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        ctx = gc.create(num_sms=num_sms, device_id=index)
        ctx.set_context()
    except Exception as exc:  # the driver or the build refused it: the task runs on every SM
        return f"--green-sms {num_sms} ignored: {type(exc).__name__}: {exc}"
    _entered.append(ctx)
    return f"kernels run in a green context of {num_sms} SMs on {device}"

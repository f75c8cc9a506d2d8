"""What several checks share: the MPS control program's note, a task's marker file, an out-of-memory reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from freeride.tooling.gpucheck.model import MPS_CONTROL, CheckContext

NO_MPS_BINARY = (f"{MPS_CONTROL} is not on PATH: the real MPS control daemon cannot be checked here "
                 "(a GPU run never falls back to the stand-in)")


def program_note(ctx: CheckContext, program: str) -> dict[str, Any]:
    """Which MPS control program a check drove: in fake mode, say plainly that it was the stand-in."""
    if ctx.fake:
        return {"control_program": program, "stand_in": True,
                "note": "fake mode: the stand-in control program (freeride.gpu._fake_mps_control), not NVIDIA's"}
    return {"control_program": program, "stand_in": False}


def read_json(path: Path) -> dict[str, Any]:
    """A marker file a task wrote ({} if it never did)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def out_of_memory(reason: str) -> bool:
    """A task's reason says an allocation failed (torch's OutOfMemoryError, CUDA's own words)."""
    low = reason.lower()
    return "out of memory" in low or "outofmemory" in low

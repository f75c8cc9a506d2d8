"""The reference check at submit: import the task in a throwaway process, never in the agent."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from freeride.agent.model import TaskSpec
from freeride.errors import TaskRefError

_CHECK_TIMEOUT_S = 60.0


async def check_ref(spec: TaskSpec) -> dict[str, Any]:
    """What `freeride.sdk.check` says of the task (kind, name, declared priority and cap); TaskRefError if
    it cannot be imported, its arguments do not bind, or its check_args refuses them (the error is the
    task's one line). User code never runs inside the agent."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "freeride.sdk.check",
        spec.ref,
        "-",  # the arguments on stdin, not on a command line every user of the host can read
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(spec.args).encode()), timeout=_CHECK_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TaskRefError(
            f"checking {spec.ref!r} (its import and check_args) took over {_CHECK_TIMEOUT_S:.0f}s; "
            "make them cheaper"
        ) from None
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        detail = err.decode(errors="replace").strip().splitlines()
        raise TaskRefError(f"checking {spec.ref!r} failed: {detail[-1] if detail else 'no output'}") from None
    if not result.get("ok"):
        raise TaskRefError(str(result.get("error")))
    return result

"""Whether this worker's freeride can serve the agent that started it (freeride.core.version.WORKER_PROTOCOL).

A task may run in its own interpreter (`freeride submit --python PATH`), with whatever freeride is installed
there. The agent asks that interpreter at submit (`PATH -m freeride.worker --protocol`: `answer()`, one JSON
line), and passes its own protocol and version to every worker it starts (`--agent-protocol N --agent-version
X`), which refuses to run when they differ (`mismatch()`): the interpreter's freeride may have changed since.
"""

from __future__ import annotations

import json
import platform
import sys

from freeride.core.version import WORKER_PROTOCOL, __version__

__all__ = ["answer", "mismatch"]


def answer() -> str:
    """What `python -m freeride.worker --protocol` prints: this freeride's worker protocol, version and Python."""
    return json.dumps({"worker_protocol": WORKER_PROTOCOL, "freeride": __version__,
                       "python": platform.python_version(), "executable": sys.executable})


def mismatch(agent_protocol: int, agent_version: str) -> str:
    """Why this worker cannot serve an agent speaking `agent_protocol` ("" when it can), and what to do."""
    if agent_protocol == WORKER_PROTOCOL:
        return ""
    return (f"the task's interpreter {sys.executable} has freeride {__version__} (worker protocol "
            f"{WORKER_PROTOCOL}), but the agent runs freeride {agent_version or '?'} (worker protocol "
            f"{agent_protocol}): install the agent's version there ({sys.executable} -m pip install "
            f"freeride=={agent_version or '<the agent version>'}), then submit the task again")

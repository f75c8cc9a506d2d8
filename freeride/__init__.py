"""freeride: run side tasks in the bubbles of pipeline-parallel training.

The public surface for side-task authors, trainer integrations and programs that drive agents
(`freeride.Client`); everything else lives in subpackages (`freeride.agent`, `freeride.trainer`,
`freeride.cli`).
"""

from typing import TYPE_CHECKING, Any

from freeride.core.version import __version__
from freeride.errors import (
    AgentCallError,
    AgentNotReadyError,
    AgentTimeoutError,
    AgentUnavailableError,
    FreerideError,
    InvalidSpecError,
    InvalidStateError,
    PermanentError,
    PoolError,
    TaskNotFoundError,
    TaskRefError,
    TaskStop,
    Unavailable,
)
from freeride.sdk import ImperativeTask, IterativeTask, StepBudget, TaskContext

if TYPE_CHECKING:
    from freeride.client import Client
    from freeride.pool import PoolItem
    from freeride.sdk.pool import PoolTask


def __getattr__(name: str) -> Any:
    """Imported on first use: the pool task and its item (redis-py costs every trainer ~0.1 s to import) and the
    client (gRPC, which a side task does not need)."""
    if name == "Client":
        from freeride.client import Client

        return Client
    if name == "PoolTask":
        from freeride.sdk.pool import PoolTask

        return PoolTask
    if name == "PoolItem":
        from freeride.pool import PoolItem

        return PoolItem
    raise AttributeError(f"module 'freeride' has no attribute {name!r}")


__all__ = [
    "AgentCallError",
    "AgentNotReadyError",
    "AgentTimeoutError",
    "AgentUnavailableError",
    "Client",
    "FreerideError",
    "ImperativeTask",
    "InvalidSpecError",
    "InvalidStateError",
    "IterativeTask",
    "PermanentError",
    "PoolError",
    "PoolItem",
    "PoolTask",
    "StepBudget",
    "TaskContext",
    "TaskNotFoundError",
    "TaskRefError",
    "TaskStop",
    "Unavailable",
    "__version__",
]

"""freeride: run side tasks in the bubbles of pipeline-parallel training.

The public surface for side-task authors and trainer integrations; everything else lives in
subpackages (`freeride.agent`, `freeride.trainer`, `freeride.cli`).
"""

from freeride.core.version import __version__
from freeride.errors import (
    AgentUnavailableError,
    FreerideError,
    InvalidSpecError,
    InvalidStateError,
    TaskNotFoundError,
    TaskRefError,
    TaskStop,
    Unavailable,
)
from freeride.sdk import ImperativeTask, IterativeTask, TaskContext

__all__ = [
    # errors
    "AgentUnavailableError",
    "FreerideError",
    # tasks
    "ImperativeTask",
    "InvalidSpecError",
    "InvalidStateError",
    "IterativeTask",
    "TaskContext",
    "TaskNotFoundError",
    "TaskRefError",
    "TaskStop",
    "Unavailable",
    "__version__",
]

"""What side-task authors use: the task base classes, their context, and Unavailable."""

from freeride.errors import Unavailable
from freeride.sdk.task import ImperativeTask, IterativeTask, TaskContext

__all__ = ["ImperativeTask", "IterativeTask", "TaskContext", "Unavailable"]

"""What side-task authors use: the task base classes and their context."""

from freeride.sdk.task import ImperativeTask, IterativeTask, TaskContext

__all__ = ["ImperativeTask", "IterativeTask", "TaskContext"]

"""What side-task authors use: the task base classes, their context, StepBudget and Unavailable."""

from freeride.errors import Unavailable
from freeride.sdk.budget import StepBudget
from freeride.sdk.task import ImperativeTask, IterativeTask, TaskContext

__all__ = ["ImperativeTask", "IterativeTask", "StepBudget", "TaskContext", "Unavailable"]

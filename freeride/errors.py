"""The errors freeride raises, under one base class."""

from __future__ import annotations


class FreerideError(Exception):
    """Base of every error freeride raises on purpose."""


class TaskRefError(FreerideError):
    """A task reference does not name a loadable task class, or its arguments do not fit it."""


class InvalidSpecError(FreerideError):
    """A task spec or a value in a request is out of range."""


class TaskNotFoundError(FreerideError):
    """No task has the given id."""


class InvalidStateError(FreerideError):
    """The task is in a state that does not allow the requested action."""


class AgentUnavailableError(FreerideError):
    """No agent answers at the given address."""


class TaskStop(BaseException):
    """Raised at a yield point when the agent asks the task to stop (pause or cancel).

    Derives from BaseException so that a task's own `except Exception` does not swallow it.
    """

"""The errors freeride raises, under one base class."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpc import StatusCode  # a type only: importing the errors imports no gRPC


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
    """No agent answers at the given address: nothing listens there, or the socket keeps this user out.

    Raised by `freeride.Client` for a call that ends UNAVAILABLE. `target` is the address tried,
    `access_problem` the one line that says the socket's permissions are the cause ("" when they are not:
    freeride.core.paths.socket_access_problem), `reason` what gRPC said.
    """

    def __init__(self, message: str, *, target: str = "", access_problem: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.target = target
        self.access_problem = access_problem
        self.reason = reason


class AgentTimeoutError(AgentUnavailableError):
    """The agent did not answer a call within its deadline (DEADLINE_EXCEEDED): it is stuck or overloaded."""


class AgentNotReadyError(AgentUnavailableError):
    """`Client.wait_ready` gave up: no agent came up at the address, or it answers but is not serving."""


class AgentCallError(FreerideError):
    """The agent refused or failed a call for a reason outside the other errors: a missing or wrong token
    (UNAUTHENTICATED), a request over the size limit (RESOURCE_EXHAUSTED), a stream the agent ended
    (CANCELLED), an internal error. `code` is the gRPC status code (a `grpc.StatusCode`), `details` its message.
    """

    def __init__(self, message: str, *, code: StatusCode, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class Unavailable(Exception):
    """Raised by a task's `step()`: a resource it needs (a server, a disk, a GPU peer) is down.

    The step does not count; the worker gives its window back and waits, holding none, calling the
    task's `available()` after `retry_s`, then after twice as long each time, up to `max_retry_s`
    between tries, until it returns True. Pause, cancel and agent loss still stop it at once.
    """

    def __init__(self, reason: str, retry_s: float = 1.0, max_retry_s: float = 30.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s


class PermanentError(Exception):
    """Raised by a task's code (its constructor, `setup()`, `load_state_dict()`, `step()`, `run()`): the task as
    given cannot run, and a restart would meet the same error (a prompt longer than the model takes, an input
    that is not UTF-8). The worker fails the task at once, with the message as its reason and no restart.

    Say what is wrong and what to do, in one line. An error that may pass (a full disk, a server down) is not
    permanent: raise anything else (restarted with backoff) or `Unavailable` from `step()` (waits).
    """


class TaskStop(BaseException):
    """Raised at a yield point when the agent asks the task to stop (pause or cancel).

    Derives from BaseException so that a task's own `except Exception` does not swallow it.
    """


class PoolError(FreerideError):
    """A work pool's URL is malformed, its Redis refuses the request, or the pool does not exist."""

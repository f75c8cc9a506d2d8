"""The agent API's status codes and the errors they stand for, both ways: one table, read by both edges.

The servicers (freeride.agent.edge.service) turn a domain error into its code with `abort_args`: the code,
the error's message as the details, and the error's class name in the trailing metadata (`ERROR_KEY`),
so that two errors sharing a code (TaskRefError and InvalidSpecError: INVALID_ARGUMENT) come back apart.
The client (freeride.client) turns any failed call back into a FreerideError with `error_of`: the class
the metadata names when the code agrees, else the code's own class (`ERROR_OF`), so a program catches
`TaskNotFoundError`, never `grpc.RpcError`. What no agent answered (UNAVAILABLE, DEADLINE_EXCEEDED)
becomes AgentUnavailableError or AgentTimeoutError, with the socket's permission problem if that is the
cause; any other code, AgentCallError with the code.
"""

from __future__ import annotations

import grpc

from freeride.core.paths import socket_access_problem
from freeride.errors import (
    AgentCallError,
    AgentTimeoutError,
    AgentUnavailableError,
    FreerideError,
    InvalidSpecError,
    InvalidStateError,
    TaskNotFoundError,
    TaskRefError,
)

# What the servicers answer for each domain error (its subclasses answer the same).
STATUS: dict[type[FreerideError], grpc.StatusCode] = {
    TaskRefError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidSpecError: grpc.StatusCode.INVALID_ARGUMENT,
    TaskNotFoundError: grpc.StatusCode.NOT_FOUND,
    InvalidStateError: grpc.StatusCode.FAILED_PRECONDITION,
}
# The inverse, for a code whose metadata names no class (a request gRPC or freeride.agent.edge.wire refused as
# malformed: INVALID_ARGUMENT), and for the codes that mean no agent answered.
ERROR_OF: dict[grpc.StatusCode, type[FreerideError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpecError,
    grpc.StatusCode.NOT_FOUND: TaskNotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidStateError,
    grpc.StatusCode.UNAVAILABLE: AgentUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: AgentTimeoutError,
}
ERROR_KEY = "freeride-error"  # trailing metadata: the class name of the domain error behind the code
_BY_NAME = {cls.__name__: cls for cls in STATUS}


def handled(exc: BaseException) -> type[FreerideError] | None:
    """The table's class that `exc` is an instance of (the nearest), or None: not a domain error to answer."""
    return next((cls for cls in type(exc).__mro__ if cls in STATUS), None)


def abort_args(exc: FreerideError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """`context.abort`'s arguments for a domain error: its code, its message, its class in the metadata."""
    cls = handled(exc)
    if cls is None:
        raise TypeError(f"{type(exc).__name__} has no status code (freeride.core.status.STATUS)")
    return STATUS[cls], str(exc), ((ERROR_KEY, cls.__name__),)


def error_of(exc: grpc.RpcError, target: str) -> FreerideError:
    """The FreerideError a failed call to the agent at `target` stands for; its message is the agent's."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or ""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        denied = socket_access_problem(target)
        unavailable = ERROR_OF[code]
        assert issubclass(unavailable, AgentUnavailableError)
        return unavailable(denied or f"no agent answers at {target}", target=target, access_problem=denied,
                           reason=details)
    named = _BY_NAME.get(_metadata(exc).get(ERROR_KEY, ""))
    if named is not None and STATUS[named] == code:
        return named(details)
    cls = ERROR_OF.get(code)
    if cls is not None:
        return cls(details)
    return AgentCallError(details or f"the agent answered {code.name}", code=code, details=details)


def _metadata(exc: grpc.RpcError) -> dict[str, str]:
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return {str(k): str(v) for k, v in trailing or ()}

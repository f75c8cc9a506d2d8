"""One error language: the servicers' table (error -> status code) and the client's inverse (status code -> error).

Every domain error a servicer answers comes back, through a real gRPC server on a unix socket, as the same
class with the same message, from a unary call and from a stream; no agent answering is AgentUnavailableError;
any other code AgentCallError with the code. A user program catches FreerideErrors, never grpc.RpcError.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.served import serving

import freeride
from freeride.agent.edge.service import TaskServicer
from freeride.core.status import ERROR_KEY, ERROR_OF, STATUS, abort_args, error_of
from freeride.errors import (
    AgentCallError,
    AgentNotReadyError,
    AgentTimeoutError,
    AgentUnavailableError,
    FreerideError,
    InvalidSpecError,
    InvalidStateError,
    TaskNotFoundError,
    TaskRefError,
)
from freeride.v1 import tasks_pb2_grpc


class _Refused(grpc.RpcError):
    """A failed call as the client sees it (grpc's own class needs a channel)."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


# -- the tables -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(STATUS))
def test_every_error_a_servicer_answers_maps_back_to_its_class_and_message(cls: type[FreerideError]) -> None:
    code, details, metadata = abort_args(cls("task 7: no such task"))
    assert code == STATUS[cls] and details == "task 7: no such task"
    back = error_of(_Refused(code, details, metadata), "unix:/nowhere.sock")
    assert type(back) is cls and str(back) == "task 7: no such task"


def test_every_code_the_servicers_emit_has_a_class_of_that_code_without_metadata() -> None:
    for code in set(STATUS.values()):
        cls = ERROR_OF[code]
        assert STATUS[cls] == code  # e.g. a request freeride.agent.edge.wire refused as malformed: InvalidSpecError
        assert type(error_of(_Refused(code, "why"), "unix:/x.sock")) is cls


def test_a_subclass_answers_as_its_tables_class_and_metadata_that_disagrees_with_the_code_is_ignored() -> None:
    class Narrower(TaskRefError):
        pass

    assert abort_args(Narrower("bad ref")) == (grpc.StatusCode.INVALID_ARGUMENT, "bad ref",
                                               ((ERROR_KEY, "TaskRefError"),))
    back = error_of(_Refused(grpc.StatusCode.NOT_FOUND, "gone", ((ERROR_KEY, "TaskRefError"),)), "x")
    assert type(back) is TaskNotFoundError
    with pytest.raises(TypeError, match="has no status code"):
        abort_args(FreerideError("not a domain error"))


def test_no_agent_and_a_slow_agent_are_their_own_errors_and_other_codes_keep_their_code() -> None:
    gone = error_of(_Refused(grpc.StatusCode.UNAVAILABLE, "failed to connect"), "unix:/no/such/agent.sock")
    assert type(gone) is AgentUnavailableError
    assert str(gone) == "no agent answers at unix:/no/such/agent.sock"
    assert (gone.target, gone.access_problem, gone.reason) == ("unix:/no/such/agent.sock", "", "failed to connect")
    slow = error_of(_Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), "unix:/a.sock")
    assert type(slow) is AgentTimeoutError and isinstance(slow, AgentUnavailableError)
    other = error_of(_Refused(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token"), "host:1")
    assert type(other) is AgentCallError and other.code == grpc.StatusCode.UNAUTHENTICATED
    assert str(other) == other.details == "missing or wrong bearer token"


# -- through a real server ------------------------------------------------------------------------------
class _Silence:
    """An event hub with no events: a Watch on it waits until cancelled."""

    def subscribe(self) -> asyncio.Queue[Any]:
        return asyncio.Queue()

    def unsubscribe(self, q: asyncio.Queue[Any]) -> None:
        pass


class _Refusing:
    """The agent's front (freeride.agent.engine.front.Agent) as TaskServicer uses it for Get, Logs and Watch: it
    refuses Get and Logs with `error`, and has no events."""

    def __init__(self) -> None:
        self.error: FreerideError = TaskNotFoundError("no task")
        self.events = _Silence()

    def get(self, task_id: str) -> Any:
        raise self.error

    def read_log(self, task_id: str, tail_lines: int, follow: bool) -> Any:
        raise self.error


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[tuple[str, _Refusing]]:
    """The real TaskServicer over a fake agent that refuses, served on a unix socket by a loop in a thread."""
    agent = _Refusing()
    target = f"unix:{tmp_path / 'agent.sock'}"

    async def add(server: grpc.aio.Server) -> None:
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(agent), server)  # type: ignore[arg-type]

    with serving(target, add):
        yield target, agent


@pytest.mark.parametrize("cls", [TaskRefError, InvalidSpecError, TaskNotFoundError, InvalidStateError])
def test_a_program_catches_the_servicers_error_from_a_call_and_from_a_stream(
    refusing: tuple[str, _Refusing], cls: type[FreerideError]
) -> None:
    target, agent = refusing
    agent.error = cls(f"task 42 says {cls.__name__}")
    with freeride.Client(target, timeout_s=10) as c:
        with pytest.raises(cls) as err:
            c.get("42")
        assert type(err.value) is cls and str(err.value) == f"task 42 says {cls.__name__}"
        with pytest.raises(cls) as err:
            list(c.logs("42"))
        assert type(err.value) is cls and str(err.value) == f"task 42 says {cls.__name__}"


def test_the_readme_way_a_program_handles_an_unknown_task(refusing: tuple[str, _Refusing]) -> None:
    target, agent = refusing
    agent.error = TaskNotFoundError("no task has id '999'")
    with freeride.Client(target, timeout_s=10) as c:
        try:
            c.get("999")
            raise AssertionError("get() of an unknown id returned")
        except freeride.TaskNotFoundError as exc:
            assert str(exc) == "no task has id '999'"


def test_no_agent_at_the_address_is_agent_unavailable_for_calls_streams_and_wait_ready(tmp_path: Path) -> None:
    target = f"unix:{tmp_path / 'nobody.sock'}"
    with freeride.Client(target, timeout_s=5) as c:
        for call in (c.stats, lambda: c.get("1"), lambda: list(c.watch()), lambda: list(c.logs("1"))):
            with pytest.raises(AgentUnavailableError) as err:
                call()
            assert type(err.value) in (AgentUnavailableError, AgentTimeoutError)
            assert err.value.target == target and str(err.value) == f"no agent answers at {target}"
        with pytest.raises(AgentNotReadyError, match="no agent answers at"):
            c.wait_ready(0.2)


def test_a_cancelled_stream_ends_its_iteration(refusing: tuple[str, _Refusing]) -> None:
    """cancel() ends a watch quietly, from another thread too (freeride top and the harness's waits do so)."""
    target, _ = refusing  # the fake agent has no events: Watch would wait forever
    with freeride.Client(target, timeout_s=5) as c:
        events = c.watch()
        started = threading.Event()

        def drain() -> list[Any]:
            started.set()
            return list(events)

        out: list[list[Any]] = []
        reader = threading.Thread(target=lambda: out.append(drain()))
        reader.start()
        assert started.wait(5)
        events.cancel()
        reader.join(10)
        assert not reader.is_alive() and out == [[]]

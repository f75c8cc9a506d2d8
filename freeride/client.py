"""A small synchronous client for one agent: `freeride.Client`, what the CLI, the benchmarks and tests use.

Answers are the API's protobuf messages (`TaskInfo`, `StatsResponse`, ...; proto/freeride/v1/tasks.proto):
read their fields as attributes. A refused call raises the FreerideError the agent raised, with its one-line
message: TaskRefError, InvalidSpecError, TaskNotFoundError, InvalidStateError; no agent answering raises
AgentUnavailableError (AgentTimeoutError past the deadline); anything else AgentCallError with the gRPC code.
Every call maps them, streams too, once, here (freeride.core.status holds the table, beside the servicers').
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from freeride.core.auth import token_interceptor
from freeride.core.paths import agent_target, socket_access_problem
from freeride.core.status import error_of
from freeride.errors import AgentNotReadyError
from freeride.v1 import tasks_pb2, tasks_pb2_grpc

# gRPC waits 1 s (then longer) before retrying a connection; an agent that is still starting is
# usually up within a few tens of ms, so retry sooner (gRPC's floor: 100 ms), and never wait long between tries.
# Not grpc.min_reconnect_backoff_ms: it is also how long a connection may take to be answered (20 s by default), and
# at 100 ms a live agent on a loaded machine was reported as absent (reliability fix 67). A socket nobody listens
# on is still refused at once.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


# Submit may wait for a check slot on the agent (up to 60 s, freeride.agent.engine.refcheck), then for the check
# itself (up to its --check-timeout-s, at most 40 s; twice with `python`: the interpreter's probe, then the check):
# its deadline exceeds all together.
SUBMIT_TIMEOUT_S = 150.0

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", covariant=True)


def _mapped(fn: Callable[Concatenate[Client, P], R]) -> Callable[Concatenate[Client, P], R]:
    """A call whose gRPC failure is raised as the FreerideError it stands for (freeride.core.status)."""
    @functools.wraps(fn)
    def wrapper(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(self, *args, **kwargs)
        except grpc.RpcError as exc:
            raise error_of(exc, self.target) from exc

    return wrapper


class Client:
    """A connection to one agent; use it as a context manager (or call close()).

    `target`: a socket path, `unix:PATH` or `HOST:PORT`; left out, `$FREERIDE_AGENT` (its first address),
    else this host's agent of GPU 0. `timeout_s` bounds each call (Submit waits longer: the agent checks the
    task's import first). `token`: the agent's bearer token, needed over TCP (freeride.core.auth.token_from).
    """

    def __init__(self, target: str | None = None, timeout_s: float = 30.0, token: str | None = None) -> None:
        if target is None:
            target = os.environ.get("FREERIDE_AGENT", "").split(",")[0].strip() or None
        self.target = agent_target(target)
        self.timeout_s = timeout_s
        self._raw_channel = grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
        self._channel = (
            grpc.intercept_channel(self._raw_channel, token_interceptor(token)) if token else self._raw_channel
        )
        self.tasks = tasks_pb2_grpc.TaskServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._raw_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the agent reports SERVING on its health service (event, not polling)."""
        try:
            grpc.channel_ready_future(self._raw_channel).result(timeout=timeout_s)
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except (grpc.FutureTimeoutError, grpc.RpcError):
            denied = socket_access_problem(self.target)
            raise AgentNotReadyError(denied or f"no agent answers at {self.target}", target=self.target,
                                     access_problem=denied) from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise AgentNotReadyError(f"the agent at {self.target} is not serving", target=self.target)

    @_mapped
    def health(self) -> int:
        """The standard gRPC health status: 1 SERVING, 2 NOT_SERVING (e.g. while the agent stops)."""
        return int(self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s).status)

    @_mapped
    def submit(self, task: tasks_pb2.TaskSpec | str, /, *, args: Mapping[str, object] | None = None, name: str = "",
               priority: int = 0, mem_limit_bytes: int = 0, max_restarts: int | None = None,
               checkpoint_interval_s: float = 0.0, no_mps: bool = False, python: str = "") -> tasks_pb2.TaskInfo:
        """A new task, as `freeride submit` makes it: `task` is 'package.module:Class' or '/abs/path.py:Class'
        (or a whole TaskSpec, the other arguments then unused); `args` its constructor's arguments (sent as
        strings); 0, "" and None mean the task's own or the agent's default; `python` the absolute path of the
        interpreter to run it in (a venv's bin/python with the task's dependencies and the agent's freeride;
        "": the agent's own). Raises INVALID_ARGUMENT with the reason when the agent refuses it (no such class,
        an argument it does not take, an interpreter without freeride at the agent's worker protocol, ...).

        Submit waits longer than other calls: the agent may first wait for a free check slot, then check
        the task's import, each up to its --check-timeout-s (at most 40 s, freeride.agent.config)."""
        spec = task if isinstance(task, tasks_pb2.TaskSpec) else tasks_pb2.TaskSpec(
            ref=task, args={k: str(v) for k, v in (args or {}).items()}, name=name, priority=priority,
            mem_limit_bytes=mem_limit_bytes, max_restarts=max_restarts, checkpoint_interval_s=checkpoint_interval_s,
            no_mps=no_mps, python=python,
        )
        return self.tasks.Submit(tasks_pb2.SubmitRequest(spec=spec), timeout=max(self.timeout_s, SUBMIT_TIMEOUT_S))

    @_mapped
    def list(self, states: Sequence[Any] | None = None) -> list[tasks_pb2.TaskInfo]:
        """Every task (or those in `states`: TaskState values or names like "READY"), oldest first."""
        request = tasks_pb2.ListRequest(states=_state_values(states or ()))
        return list(self.tasks.List(request, timeout=self.timeout_s).tasks)

    @_mapped
    def get(self, task_id: str) -> tasks_pb2.TaskInfo:
        """One task: state, reason, counters, progress, ... (NOT_FOUND for an unknown id)."""
        return self.tasks.Get(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    @_mapped
    def cancel(self, task_id: str) -> tasks_pb2.TaskInfo:
        """Cancel a task: it checkpoints, then is CANCELLED (the answer may still show it stopping)."""
        return self.tasks.Cancel(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    @_mapped
    def pause(self, task_id: str) -> tasks_pb2.TaskInfo:
        """Pause a task: it checkpoints and its worker exits, freeing its memory."""
        return self.tasks.Pause(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    @_mapped
    def resume(self, task_id: str) -> tasks_pb2.TaskInfo:
        """Resume a paused task from its checkpoint."""
        return self.tasks.Resume(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    @_mapped
    def delete(self, task_id: str) -> tasks_pb2.DeleteResponse:
        """Remove a finished task with its checkpoint and logs (FAILED_PRECONDITION for one not finished)."""
        return self.tasks.Delete(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    @_mapped
    def prune(self, older_than_s: float, states: Sequence[Any] = (), dry_run: bool = False
              ) -> tasks_pb2.PruneResponse:
        """Remove the finished tasks (of `states`, values or names like "FAILED"; default all three) last changed
        over `older_than_s` ago."""
        request = tasks_pb2.PruneRequest(older_than_s=older_than_s, states=_state_values(states), dry_run=dry_run)
        return self.tasks.Prune(request, timeout=self.timeout_s)

    @_mapped
    def stats(self) -> tasks_pb2.StatsResponse:
        """The GPU's totals (bubbles, harvested time, memory, trainer streams) and every task."""
        return self.tasks.Stats(tasks_pb2.StatsRequest(), timeout=self.timeout_s)

    @_mapped
    def timeline(self, since_ns: int = 0) -> tasks_pb2.TimelineResponse:
        """The agent's recent bubbles and windows (with each side-task step), for plotting."""
        return self.tasks.Timeline(tasks_pb2.TimelineRequest(since_ns=since_ns), timeout=self.timeout_s)

    def logs(self, task_id: str, follow: bool = False, tail_lines: int = 0) -> LogStream:
        """The task's output in chunks (the first one names the log file): the stored log, its last
        `tail_lines` lines if given, then with `follow` new output until the task is over; cancel() ends it.
        Errors come while iterating: TaskNotFoundError for an unknown id, AgentUnavailableError, ..."""
        call = self.tasks.Logs(
            tasks_pb2.LogsRequest(id=task_id, follow=follow, tail_lines=tail_lines),
            timeout=None if follow else max(self.timeout_s, 60.0),
        )
        return _Stream(call, self.target)

    def watch(self) -> EventStream:
        """Events as they happen, until `cancel()` is called on the returned stream (the iteration then ends).
        It returns once the agent has subscribed it: every event after that is in the stream, so a state read
        after `watch()` and the events that follow leave no gap."""
        call = self.tasks.Watch(tasks_pb2.WatchRequest())
        call.initial_metadata()  # the agent sends it once subscribed (or the call failed: iterating raises)
        return _Stream(call, self.target)

    def wait(self, task_id: str, states: Sequence[Any], timeout_s: float = 60.0) -> tasks_pb2.TaskInfo:
        """Block until the task is in one of `states` (TaskState values or names like "READY") or over (DONE,
        FAILED, CANCELLED: check `.state`); its info then. Driven by the agent's events, not by polling.
        A task is STARTING after submit while its worker loads; `wait(id, ["READY", "RUNNING"])` waits that out.
        TimeoutError after `timeout_s`."""
        wanted = {*_state_values(states), *_OVER}
        events = self.watch()  # subscribed before the state is read: a change in between is in the stream
        timer = threading.Timer(timeout_s, events.cancel)
        timer.start()
        try:
            info = self.get(task_id)
            if info.state in wanted:
                return info
            for ev in events:
                if ev.task.id == task_id and ev.task.state in wanted:
                    return ev.task
        finally:
            timer.cancel()
            events.cancel()
        info = self.get(task_id)
        raise TimeoutError(f"task {task_id} is still {tasks_pb2.TaskState.Name(info.state).removeprefix('TASK_STATE_')}"
                           f" after {timeout_s:g} s ({info.reason or 'no reason given'})")


_OVER = (tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED, tasks_pb2.TASK_STATE_CANCELLED)


def _state_values(states: Sequence[Any]) -> list[Any]:
    """TaskState values, each given as one or by name ("READY", "failed")."""
    return [tasks_pb2.TaskState.Value(f"TASK_STATE_{s.upper()}") if isinstance(s, str) else s for s in states]


class _Call(Protocol[M]):
    """A server-streaming gRPC call, as grpc returns it: iterate it, cancel it."""

    def __next__(self) -> M: ...
    def cancel(self) -> bool: ...


class _Stream(Generic[M]):
    """A stream whose failures are raised as FreerideErrors; cancel() (from any thread) ends the iteration."""

    def __init__(self, call: _Call[M], target: str) -> None:
        self._call = call
        self._target = target
        self._cancelled = False

    def __iter__(self) -> Iterator[M]:
        return self

    def __next__(self) -> M:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled and exc.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise error_of(exc, self._target) from exc

    def cancel(self) -> bool:
        self._cancelled = True
        return self._call.cancel()


EventStream = _Stream[tasks_pb2.AgentEvent]  # the agent's events: iterate; cancel() ends the iteration
LogStream = _Stream[tasks_pb2.LogChunk]  # a task's output: iterate; cancel() ends the iteration


AgentClient = Client  # the name it had before it was public

"""A small synchronous client for one agent: what the CLI, the benchmarks and tests use."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from freeride.core.auth import token_interceptor
from freeride.errors import AgentUnavailableError
from freeride.v1 import tasks_pb2, tasks_pb2_grpc

# gRPC waits 1 s (then longer) before retrying a connection; an agent that is still starting is
# usually up within a few tens of ms, so retry sooner, and never wait long between tries.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


SUBMIT_TIMEOUT_S = 90.0  # > 2 x the agent's longest check bound, plus the insert and the worker's spawn


class AgentClient:
    """`token`: the agent's bearer token, needed over TCP (see freeride.core.auth.token_from)."""

    def __init__(self, target: str, timeout_s: float = 30.0, token: str | None = None) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._raw_channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._channel = (
            grpc.intercept_channel(self._raw_channel, token_interceptor(token)) if token else self._raw_channel
        )
        self.tasks = tasks_pb2_grpc.TaskServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._raw_channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the agent reports SERVING on its health service (event, not polling)."""
        try:
            grpc.channel_ready_future(self._raw_channel).result(timeout=timeout_s)
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except (grpc.FutureTimeoutError, grpc.RpcError):
            raise AgentUnavailableError(f"no agent answers at {self.target}") from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise AgentUnavailableError(f"the agent at {self.target} is not serving")

    def health(self) -> int:
        return int(self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s).status)

    def submit(self, spec: tasks_pb2.TaskSpec) -> tasks_pb2.TaskInfo:
        """Submit waits longer than other calls: the agent may first wait for a free check slot, then check
        the task's import, each up to its --check-timeout-s (at most 40 s, freeride.agent.config)."""
        return self.tasks.Submit(tasks_pb2.SubmitRequest(spec=spec), timeout=max(self.timeout_s, SUBMIT_TIMEOUT_S))

    def list(self, states: list[Any] | None = None) -> list[tasks_pb2.TaskInfo]:
        return list(self.tasks.List(tasks_pb2.ListRequest(states=states or []), timeout=self.timeout_s).tasks)

    def get(self, task_id: str) -> tasks_pb2.TaskInfo:
        return self.tasks.Get(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    def cancel(self, task_id: str) -> tasks_pb2.TaskInfo:
        return self.tasks.Cancel(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    def pause(self, task_id: str) -> tasks_pb2.TaskInfo:
        return self.tasks.Pause(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    def resume(self, task_id: str) -> tasks_pb2.TaskInfo:
        return self.tasks.Resume(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    def delete(self, task_id: str) -> tasks_pb2.DeleteResponse:
        """Remove a finished task with its checkpoint and logs (FAILED_PRECONDITION for one not finished)."""
        return self.tasks.Delete(tasks_pb2.TaskRef(id=task_id), timeout=self.timeout_s)

    def prune(self, older_than_s: float, states: Sequence[Any] = (), dry_run: bool = False
              ) -> tasks_pb2.PruneResponse:
        """Remove the finished tasks (of `states`; default all three) last changed over `older_than_s` ago."""
        request = tasks_pb2.PruneRequest(older_than_s=older_than_s, states=list(states), dry_run=dry_run)
        return self.tasks.Prune(request, timeout=self.timeout_s)

    def stats(self) -> tasks_pb2.StatsResponse:
        return self.tasks.Stats(tasks_pb2.StatsRequest(), timeout=self.timeout_s)

    def timeline(self, since_ns: int = 0) -> tasks_pb2.TimelineResponse:
        """The agent's recent bubbles and windows (with each side-task step), for plotting."""
        return self.tasks.Timeline(tasks_pb2.TimelineRequest(since_ns=since_ns), timeout=self.timeout_s)

    def watch(self) -> EventStream:
        """Events as they happen, until `cancel()` is called on the returned stream."""
        stream: EventStream = self.tasks.Watch(tasks_pb2.WatchRequest())
        return stream


class EventStream(Protocol):
    """The agent's event stream: iterate it; cancel() ends it (the iterator then raises CANCELLED)."""

    def __iter__(self) -> Iterator[tasks_pb2.AgentEvent]: ...
    def __next__(self) -> tasks_pb2.AgentEvent: ...
    def cancel(self) -> bool: ...

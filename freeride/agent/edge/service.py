"""gRPC servicers: the edge where domain errors become status codes and messages are checked."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from freeride.agent.domain.events import Control
from freeride.agent.domain.model import TaskRecord
from freeride.agent.edge.convert import (
    control_to_pb,
    delete_to_pb,
    event_to_pb,
    history_to_pb,
    prune_to_pb,
    setup_to_pb,
    spec_from_pb,
    state_from_pb,
    stats_to_pb,
    task_to_pb,
    worker_message_from_pb,
)
from freeride.agent.edge.ring import HANDSHAKE_TIMEOUT_S
from freeride.agent.edge.trainer_link import TrainerLink
from freeride.agent.edge.wire import Malformed, reject
from freeride.agent.engine.front import Agent
from freeride.core.status import STATUS, abort_args
from freeride.errors import InvalidSpecError, InvalidStateError
from freeride.v1 import tasks_pb2, tasks_pb2_grpc, trainer_pb2_grpc, worker_pb2_grpc

log = logging.getLogger("freeride.agent")

R = TypeVar("R")


def _status_errors(
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except tuple(STATUS) as exc:  # the table, and its inverse for the client: freeride.core.status
            await context.abort(*abort_args(exc))
            raise  # unreachable: abort raises

    return wrapper


class TaskServicer(tasks_pb2_grpc.TaskServiceServicer):
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def _info(self, rec: TaskRecord) -> tasks_pb2.TaskInfo:
        return task_to_pb(self._agent.info(rec))

    @_status_errors
    async def Submit(self, request: tasks_pb2.SubmitRequest, context: grpc.aio.ServicerContext) -> tasks_pb2.TaskInfo:
        if not request.HasField("spec"):
            raise InvalidSpecError("SubmitRequest.spec is missing")
        return self._info(await self._agent.submit(spec_from_pb(request.spec)))

    @_status_errors
    async def List(self, request: tasks_pb2.ListRequest, context: grpc.aio.ServicerContext) -> tasks_pb2.ListResponse:
        wanted = set()
        for value in request.states:
            state = state_from_pb(value)
            if state is None:
                raise InvalidSpecError(f"unknown task state {value}")
            wanted.add(state)
        infos = [self._info(r) for r in self._agent.table.records.values() if not wanted or r.state in wanted]
        return tasks_pb2.ListResponse(tasks=infos)

    @_status_errors
    async def Get(self, request: tasks_pb2.TaskRef, context: grpc.aio.ServicerContext) -> tasks_pb2.TaskInfo:
        return self._info(self._agent.get(request.id))

    @_status_errors
    async def Cancel(self, request: tasks_pb2.TaskRef, context: grpc.aio.ServicerContext) -> tasks_pb2.TaskInfo:
        return self._info(await self._agent.cancel(request.id))

    @_status_errors
    async def Pause(self, request: tasks_pb2.TaskRef, context: grpc.aio.ServicerContext) -> tasks_pb2.TaskInfo:
        return self._info(await self._agent.pause(request.id))

    @_status_errors
    async def Resume(self, request: tasks_pb2.TaskRef, context: grpc.aio.ServicerContext) -> tasks_pb2.TaskInfo:
        return self._info(await self._agent.resume(request.id))

    @_status_errors
    async def Delete(self, request: tasks_pb2.TaskRef, context: grpc.aio.ServicerContext) -> tasks_pb2.DeleteResponse:
        removal = await self._agent.delete(request.id)
        return delete_to_pb(removal, self._agent.info(removal.tasks[0]))

    @_status_errors
    async def Prune(
        self, request: tasks_pb2.PruneRequest, context: grpc.aio.ServicerContext
    ) -> tasks_pb2.PruneResponse:
        if not request.HasField("older_than_s"):
            raise InvalidSpecError("PruneRequest.older_than_s is missing (0 removes every finished task)")
        states = {state_from_pb(value) for value in request.states}
        if None in states:
            raise InvalidSpecError(f"unknown task state in {list(request.states)}")
        removal = await self._agent.prune(request.older_than_s, {s for s in states if s is not None}, request.dry_run)
        return prune_to_pb(removal, [self._agent.info(r) for r in removal.tasks])

    @_status_errors
    async def Stats(
        self, request: tasks_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> tasks_pb2.StatsResponse:
        return stats_to_pb(await self._agent.stats())

    @_status_errors
    async def Timeline(
        self, request: tasks_pb2.TimelineRequest, context: grpc.aio.ServicerContext
    ) -> tasks_pb2.TimelineResponse:
        return history_to_pb(self._agent.history(request.since_ns))

    @_status_errors
    async def Logs(self, request: tasks_pb2.LogsRequest, context: grpc.aio.ServicerContext) -> None:
        chunks = self._agent.read_log(request.id, request.tail_lines, request.follow)  # NOT_FOUND before any write
        async with contextlib.aclosing(chunks):
            try:
                await context.write(tasks_pb2.LogChunk(path=self._agent.log_path(request.id)))
                async for data in chunks:
                    await context.write(tasks_pb2.LogChunk(data=data))
            except Exception as exc:  # (as in Watch) a failed write: the reader is gone
                log.debug("logs stream from %s ended: %r", context.peer(), exc)

    async def Watch(self, request: tasks_pb2.WatchRequest, context: grpc.aio.ServicerContext) -> None:
        # context.write rather than yield: a client that cancels while a write waits on its flow control fails
        # that write (ExecuteBatchError, before the call shows as cancelled); yielded, gRPC logs a traceback.
        q = self._agent.events.subscribe()
        try:
            await context.send_initial_metadata(())  # "subscribed": Client.watch() returns on it (no event missed)
            while True:
                event = event_to_pb(await q.get())
                try:
                    await context.write(event)
                except Exception as exc:  # a failed write means the stream is gone: nothing else to tell
                    log.debug("watch stream from %s ended: %r", context.peer(), exc)
                    return
        finally:
            self._agent.events.unsubscribe(q)


class BubbleServicer(trainer_pb2_grpc.BubbleServiceServicer):
    """One call per training rank, each served by its `TrainerLink` (freeride.agent.edge.trainer_link); this
    servicer only owns the open calls, to end them when the agent stops."""

    def __init__(self, agent: Agent, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        """`handshake_timeout_s`: how long a ring offered waits for its trainer (freeride.agent.edge.ring)."""
        self._agent = agent
        self._handshake_timeout_s = handshake_timeout_s
        self._calls: set[asyncio.Task[Any]] = set()  # the tasks serving the open streams (gRPC's: never ours)
        self._closing = False

    async def close_streams(self, timeout_s: float = 5.0) -> None:
        """End every trainer stream with status OK (the agent is stopping), and refuse new ones the same way.

        Each call is woken out of its read by a cancellation that `ReportBubbles` takes as "end cleanly"; left
        to `server.stop`, the cancellation would reach gRPC itself, which logs it as an unhandled exception.
        A trainer sees its stream end and goes on as when the agent dies: it reconnects in the background."""
        self._closing = True
        calls = set(self._calls)
        for call in calls:
            call.cancel("the agent is stopping")
        if calls:
            await asyncio.wait(calls, timeout=timeout_s)

    async def ReportBubbles(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        call = asyncio.current_task()
        if self._closing or call is None:
            return  # stopping: the stream ends at once; the trainer tries again later
        self._calls.add(call)
        try:
            await self._report_bubbles(context)
        except asyncio.CancelledError:
            if not self._closing:
                raise  # the peer went (gRPC cancels its call): as before
            call.uncancel()  # our own wake-up from close_streams: return, and gRPC ends the call with OK
        finally:
            self._calls.discard(call)

    async def _report_bubbles(self, context: grpc.aio.ServicerContext) -> None:
        config = self._agent.config
        await TrainerLink(self._agent.trainers, config.gpu, config.access, context, self._handshake_timeout_s).serve()


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def Attach(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if isinstance(first, Malformed):
            await reject(context, first)
        if first is grpc.aio.EOF or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first worker message must be hello")
        hello = first.hello
        outbox: asyncio.Queue[Control | None] = asyncio.Queue()
        try:
            setup = self._agent.attach(hello.task_id, hello.instance, outbox)
        except InvalidStateError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        await context.write(setup_to_pb(setup))
        reader = asyncio.ensure_future(self._read(context, hello.task_id, hello.instance, outbox))
        try:
            while True:
                cmd = await outbox.get()
                if cmd is None:
                    break
                await context.write(control_to_pb(cmd))
        finally:
            reader.cancel()
            self._agent.detach(hello.task_id, hello.instance)
            await asyncio.gather(reader, return_exceptions=True)  # owned: ended before the stream is

    async def _read(
        self,
        context: grpc.aio.ServicerContext,
        task_id: str,
        instance: int,
        outbox: Any,
    ) -> None:
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                if isinstance(msg, Malformed):
                    log.warning("task %s: %s; closing its stream", task_id, msg.describe())
                    break
                body = worker_message_from_pb(msg)
                if body is not None:
                    self._agent.on_worker_message(task_id, instance, body)
        except Exception:
            log.exception("worker stream for task %s failed", task_id)
        finally:
            outbox.put_nowait(None)

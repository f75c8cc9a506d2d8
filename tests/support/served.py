"""The servicers at the second depth: real gRPC on a temporary unix socket, served in-process by a loop in a
thread, over the engine with its fakes (freeride.agent.engine.front.Agent on a FakeLauncher) and a manual clock.

A test calls in with the real clients (freeride.Client, BubbleReporter, the generated stubs) from its own thread,
and reads the agent's state on the loop through `Served.on_loop`: the engine is only ever touched from its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

import freeride
from freeride.agent.config import AgentConfig
from freeride.agent.edge.ring import HANDSHAKE_TIMEOUT_S
from freeride.agent.edge.service import BubbleServicer, TaskServicer, WorkerServicer
from freeride.agent.engine.front import Agent
from freeride.agent.state.registry import Registry
from freeride.client import EventStream
from freeride.gpu.control import GpuControl
from freeride.v1 import tasks_pb2_grpc, trainer_pb2_grpc, worker_pb2_grpc
from support.clock import ManualClock
from support.engine_fakes import FakeLauncher, FakeWorker

T = TypeVar("T")


@contextlib.contextmanager
def serving(target: str, add: Callable[[grpc.aio.Server], Awaitable[Any]]) -> Iterator[asyncio.AbstractEventLoop]:
    """A grpc.aio server on `target`, on a loop in a thread; `add` (run on that loop first) puts the servicers on it
    and may build what they serve. Stopped, then the loop, on the way out."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="served-loop")
    thread.start()

    async def start() -> grpc.aio.Server:
        server = grpc.aio.server()
        await add(server)
        server.add_insecure_port(target)
        await server.start()
        return server

    try:
        server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        try:
            yield loop
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclass
class Served:
    """The real servicers over a real engine with a fake launcher and a manual clock, at `target`."""

    target: str
    loop: asyncio.AbstractEventLoop
    agent: Agent
    bubbles: BubbleServicer
    launcher: FakeLauncher
    clock: ManualClock

    def on_loop(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the agent's loop, its answer back here."""

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def watch(self, client: freeride.Client) -> EventStream:
        """`client.watch()`, returned once the agent has subscribed it: every event from then on reaches it."""
        hub, subscribed = self.agent.events, threading.Event()
        subscribe = hub.subscribe

        def marked() -> asyncio.Queue[Any]:
            q = subscribe()
            subscribed.set()
            return q

        self.on_loop(lambda: setattr(hub, "subscribe", marked))
        try:
            events = client.watch()
            if not subscribed.wait(10):
                events.cancel()
                raise TimeoutError("the Watch call never reached the agent")
            return events
        finally:
            self.on_loop(lambda: delattr(hub, "subscribe"))

    def wait(self, coro: Awaitable[T], timeout_s: float = 10) -> T:
        """A coroutine run on the agent's loop, awaited from here."""

        async def call() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout_s)


@contextlib.contextmanager
def served_agent(state_dir: Path, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, gpu: GpuControl | None = None,
                 **config: Any) -> Iterator[Served]:
    """An Agent (real task table, scheduler, store on SQLite; a FakeLauncher) behind TaskService, BubbleService,
    WorkerService and the health service on `state_dir`/agent.sock; shut down as the server does it: trainer
    streams ended, then the agent."""
    sock = state_dir / "agent.sock"
    clock = ManualClock()
    built: list[tuple[Agent, BubbleServicer, FakeLauncher]] = []

    async def add(server: grpc.aio.Server) -> None:
        launcher = FakeLauncher()
        agent = Agent(AgentConfig(state_dir=state_dir, socket=sock, **config), Registry(state_dir / "registry.db"),
                      launcher, clock=clock, gpu=gpu)
        bubbles = BubbleServicer(agent, handshake_timeout_s)
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(agent), server)
        trainer_pb2_grpc.add_BubbleServiceServicer_to_server(bubbles, server)
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(agent), server)
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        await agent.start()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        built.append((agent, bubbles, launcher))

    with serving(f"unix:{sock}", add) as loop:
        agent, bubbles, launcher = built[0]
        served = Served(f"unix:{sock}", loop, agent, bubbles, launcher, clock)
        try:
            yield served
        finally:
            served.wait(bubbles.close_streams())
            served.wait(_shutdown(agent, launcher), 30)


async def _shutdown(agent: Agent, launcher: FakeLauncher) -> int:
    """Agent.shutdown, with each fake worker exiting once it is killed, as a real one would."""

    async def dies(worker: FakeWorker) -> None:
        await worker.killed.wait()
        if not worker.exited.is_set():
            worker.exit(-9)

    deaths = [asyncio.ensure_future(dies(w)) for w in launcher.workers if not w.exited.is_set()]
    try:
        return await agent.shutdown()
    finally:
        for death in deaths:
            death.cancel()
        await asyncio.gather(*deaths, return_exceptions=True)

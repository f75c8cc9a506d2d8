"""Background tasks with an owner: every task created on the loop is kept until it ends, and its
exception is logged and handed to whoever can act on it, never lost (STYLE rule 16)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("freeride.agent")

OnError = Callable[[BaseException], None]


class Background:
    def __init__(self, what: str) -> None:
        self._what = what  # for the log: "worker supervision", ...
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], on_error: OnError | None = None) -> asyncio.Task[Any]:
        """Run `coro` as an owned task; if it raises, log the exception and call `on_error` with it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        label = getattr(coro, "__qualname__", "a task")
        task.add_done_callback(lambda t: self._reap(t, label, on_error))
        return task

    def _reap(self, task: asyncio.Task[Any], label: str, on_error: OnError | None) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        log.error("%s: %s failed: %r", self._what, label, exc, exc_info=exc)
        if on_error is not None:
            on_error(exc)

    async def wait(self) -> None:
        """Until every task running now (and any they start meanwhile) has ended."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))  # (not gather: cancelling the waiter must not cancel them)

    async def cancel(self) -> None:
        """Cancel every task and wait until they have ended."""
        for task in self._tasks:
            task.cancel()
        await self.wait()

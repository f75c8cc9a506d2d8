"""A thread of its own for the reads the memory watchdog blocks on, so that the agent's loop never does.

A watchdog sample reads each worker's memory (PSS over its process tree: one /proc/PID/smaps_rollup per
process, milliseconds for a large one; or its cgroup's memory.current; or the device's per-process
memory and each worker's tree) and scans /proc for the processes new in each worker's tree. On the loop
that would hold back every bubble edge and grant for as long, several times a second. `ThreadOffload`
runs such a read on one thread owned by the supervisor (one: the reads of a tick run one after the other
and never two ticks at once) and hands its result back to the loop, which alone applies it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from freeride.core.cpu import lower_this_thread

T = TypeVar("T")


class Offload(Protocol):
    """Where blocking reads run (a thread of the agent's; in tests, a thread or the loop itself)."""

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()`'s result (or exception), computed off the loop; `fn` must not touch the loop's state."""
        ...

    def close(self) -> None:
        """Once nothing runs any more: release the thread."""
        ...


class ThreadOffload:
    def __init__(self, name: str, background: bool = False) -> None:
        """`background`: its thread at nice 19 (freeride.core.cpu.lower_this_thread), for bursty work no bubble
        waits for (prune's deletions); not the watchdog's reads, which a memory cap's kill waits for."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,  # (its thread starts on first use)
                                        initializer=lower_this_thread if background else None)

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

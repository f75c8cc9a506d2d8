"""When a bubble's edges are taken on a CUDA stage: three modes, one interface.

An NCCL receive does not block the CPU: the training thread reaches a pipeline wait while the GPU
is still running the kernels queued before it, and leaves the wait before the data has landed.
The GPU's real bubble is from the moment it drains to the moment the received data is there.

- `event` (the default): the training thread records a CUDA event (timing disabled, from a reused pool) and goes
  on; one watcher thread, off the training thread, blocks in `event.synchronize()` (which releases
  the GIL) and reports START once the GPU has drained, and END once the event recorded after the
  wait (the received data) has completed. The training thread never waits for the GPU.
- `stream`: the training thread synchronises the current stream before the wait (START when the
  GPU has drained) and after it (END when the data has landed). Exact, but the CPU can no longer
  run ahead queueing kernels across a wait.
- `off`: edges at the CPU's own times. Exact on CPU (gloo blocks the CPU); on CUDA the START comes
  early (the GPU is still busy) and the END may come early too.

Choose with `instrument(..., edge_sync="stream")` or `FREERIDE_EDGE_SYNC=stream`. On a CPU device the
mode is always `off`: there is nothing to synchronise.

Why `event`: on an H200 (torch 2.11, `freeride bench overhead --neighbour gpu`, where a wait stalls the
stream as an NCCL receive does and the CPU runs ahead), harvesting in `stream` mode slowed the stage by
5.3 % (6.4 % under MPS), in `event` mode by 0.8 % (2.3 % under MPS), at about the same harvest
(docs/benchmarks.md, "First GPU run").
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from freeride.trainer._cuda import on_cuda

log = logging.getLogger(__name__)

EDGE_MODES = ("stream", "event", "off")
DEFAULT_EDGE_MODE = "event"
ENV_EDGE_SYNC = "FREERIDE_EDGE_SYNC"

Stamped = Callable[[int], None]  # called with the edge's time (time.monotonic_ns())


class Event(Protocol):
    """What the event mode needs of a CUDA event (torch.cuda.Event; a fake in the tests)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class EdgeClock(Protocol):
    """Takes the edges of one tracker in order: `edge` waits for the GPU (however the mode does),
    `then` runs a bookkeeping step in the same order as the edges around it."""

    mode: str

    def edge(self, fn: Stamped) -> None: ...

    def then(self, fn: Callable[[], object]) -> None: ...

    def close(self) -> None: ...


def resolve_mode(device: Any, edge_sync: str | None = None, sync_cuda: bool | None = None) -> str:
    """The edge mode for a stage on `device`: the argument, else $FREERIDE_EDGE_SYNC, else the default.

    A bad argument raises ValueError; a bad environment variable is logged and the default used (an
    environment variable never stops a training job). `sync_cuda=False` (the older flag) means `off`.
    """
    if edge_sync is not None and edge_sync not in EDGE_MODES:
        raise ValueError(f"edge_sync must be one of {', '.join(EDGE_MODES)}, not {edge_sync!r}")
    if not on_cuda(device):
        return "off"
    if edge_sync is not None:
        return edge_sync
    if sync_cuda is False:
        return "off"
    env = os.environ.get(ENV_EDGE_SYNC, "")
    if env and env not in EDGE_MODES:
        log.warning("%s=%r is not one of %s; using %s", ENV_EDGE_SYNC, env, ", ".join(EDGE_MODES), DEFAULT_EDGE_MODE)
        env = ""
    return env or DEFAULT_EDGE_MODE


def clock_for(device: Any, edge_sync: str | None = None, sync_cuda: bool | None = None) -> EdgeClock:
    """The clock of a stage on `device` (see resolve_mode)."""
    mode = resolve_mode(device, edge_sync, sync_cuda)
    if mode == "off":
        if on_cuda(device):
            log.warning("edge_sync 'off' on %s: bubble edges are taken at the CPU's times, while the GPU is still "
                        "busy; side tasks then harvest next to nothing or slow training (H200: +18-24%%). "
                        "Leave edge_sync unset for 'event'", device)
        return InlineClock()
    import torch

    if mode == "stream":
        return InlineClock(lambda: torch.cuda.current_stream(device).synchronize(), mode="stream")

    def new_event() -> Event:
        return _CudaEvent(torch, device)

    return EventClock(new_event)


class InlineClock:
    """`stream` (a synchronise before each edge) and `off` (none): everything on the training thread."""

    def __init__(self, sync: Callable[[], None] | None = None, mode: str = "off") -> None:
        self._sync = sync
        self.mode = mode
        self.direct = sync is None  # edges at the CPU's time on the calling thread: a tracker may stamp them itself

    def edge(self, fn: Stamped) -> None:
        if self._sync is not None:
            self._sync()
        fn(time.monotonic_ns())

    def then(self, fn: Callable[[], object]) -> None:
        fn()

    def close(self) -> None:
        pass


_STOP = object()


class EventClock:
    """`event`: the training thread records an event and queues it; the watcher thread waits for it.

    One watcher per tracker, started with the clock and joined by close() after it has reported
    every queued edge, so the reporter's ring keeps a single producer (this thread) and the edges
    keep their order. Events are reused: one is back in the pool once the watcher has seen it.
    """

    mode = "event"

    def __init__(self, new_event: Callable[[], Event]) -> None:
        self._new_event = new_event
        self._pool: list[Event] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failed = False
        self._thread = threading.Thread(target=self._watch, name="freeride-edges", daemon=True)
        self._thread.start()

    @property
    def pooled(self) -> int:
        """Events created and back in the pool (for the tests)."""
        return len(self._pool)

    def edge(self, fn: Stamped) -> None:
        try:
            ev = self._pool.pop()
        except IndexError:
            ev = self._new_event()
        ev.record()
        self._queue.put((ev, fn))

    def then(self, fn: Callable[[], object]) -> None:
        self._queue.put((None, fn))

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _watch(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            ev, fn = item
            try:
                if ev is not None:
                    ev.synchronize()  # releases the GIL while the GPU drains
                    self._pool.append(ev)
                    fn(time.monotonic_ns())
                else:
                    fn()
            except Exception:  # never let a reporting error end the watcher: training goes on either way
                if not self._failed:
                    self._failed = True
                    log.exception("freeride: reporting a bubble edge failed (logged once; edges go on)")


class _CudaEvent:
    """A torch.cuda.Event recorded on the stage's current stream. Timing disabled (cheaper); blocking
    sync, so the watcher sleeps in synchronize() instead of spinning on a core the trainer may need."""

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self._device = device
        self._event = torch.cuda.Event(enable_timing=False, blocking=True)

    def record(self) -> None:
        self._event.record(self._torch.cuda.current_stream(self._device))

    def synchronize(self) -> None:
        self._event.synchronize()

"""Instrument a torch.distributed.pipelining schedule: every receive wait becomes a reported bubble.

    from freeride.trainer.torch_pipelining import instrument
    handle = instrument(schedule)   # finds the agent of this rank's GPU
    ...                             # schedule.step(...) as before
    handle.undo()

All schedules (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble,
DualPipeV) wait for their peers in one private module function, `_wait_batch_p2p`; this module
wraps it (and `_batch_p2p`, to learn what each wait is for), and wraps the public `step()` to
number the waits of each iteration. The k-th wait of a step is slot k, so the same bubble gets
the same slot in every iteration. On CUDA the stream is synchronised before the wait (the GPU
has drained: the bubble starts) and after it (the received data has landed: it ends), because
an NCCL wait does not block the CPU. On gloo the CPU wait is exact.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from freeride.errors import FreerideError
from freeride.trainer._connect import connect
from freeride.trainer._cuda import free_memory, stream_sync
from freeride.trainer._waits import BWD, FWD, BubbleRecord, Instrumented, WaitTracker, restore_attribute
from freeride.trainer.reporter import BubbleReporter

log = logging.getLogger(__name__)

TESTED_TORCH = ">=2.13,<2.14"

__all__ = ["TESTED_TORCH", "BubbleRecord", "HookUnavailableError", "Instrumentation", "instrument"]


class HookUnavailableError(FreerideError):
    """This torch version does not have the hook point freeride instruments."""


_local = threading.local()  # .active: the Instrumentation whose step() runs on this thread


class Instrumentation(Instrumented):
    def __init__(self, schedule: Any, tracker: WaitTracker) -> None:
        super().__init__(tracker)
        self.schedule = schedule
        self._tagged_ops: dict[int, int] = {}
        self._tagged_works: dict[int, int] = {}

    # -- the wrapped step() ------------------------------------------------------------------------
    def _run_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tracker = self.tracker
        if not tracker.enabled:
            tracker.skip_step()
            return original(*args, **kwargs)
        tracker.begin_step()
        self._tagged_ops.clear()
        self._tagged_works.clear()
        previous = getattr(_local, "active", None)
        _local.active = self
        try:
            return original(*args, **kwargs)
        finally:
            _local.active = previous
            tracker.end_step()
            if tracker.iteration == 0:
                self._check_fired()

    def _check_fired(self) -> None:
        """The hook is private to torch: say so plainly if a multi-rank step went by without a wait."""
        import torch
        import torch.distributed as dist

        if self.tracker.waits_seen == 0 and dist.is_initialized() and dist.get_world_size() > 1:
            log.error(
                "freeride saw no pipeline wait in the first step() with torch %s (tested: %s): "
                "bubbles are not reported; instrumentation removed",
                torch.__version__, TESTED_TORCH,
            )
            self.undo()

    # -- the wrapped module functions ----------------------------------------------------------------
    def tag(self, ops: list[Any], direction: int) -> list[Any]:
        for op in ops:
            self._tagged_ops[id(op)] = direction
        return ops

    def batched(self, ops: list[Any], works: list[Any]) -> None:
        direction = 0
        for op in ops:
            direction |= self._tagged_ops.pop(id(op), 0)
        self._tagged_works[id(works)] = direction

    def wait(self, original: Callable[[list[Any]], None], works: list[Any]) -> None:
        if not works:
            return original(works)
        direction = self._tagged_works.pop(id(works), 0)
        return self.tracker.wait(direction, lambda: original(works))


# -- the module-level hook, shared by every instrumented schedule in the process ---------------------
_hook_lock = threading.Lock()
_hook_users = 0
_originals: dict[str, Callable[..., Any]] = {}


def _schedules_module() -> Any:
    try:
        import torch
        import torch.distributed.pipelining.schedules as schedules
    except ImportError as exc:
        raise HookUnavailableError(f"torch.distributed.pipelining is not importable: {exc}") from None
    for name in ("_wait_batch_p2p", "_batch_p2p"):
        if not callable(getattr(schedules, name, None)):
            raise HookUnavailableError(
                f"torch {torch.__version__} has no torch.distributed.pipelining.schedules.{name}; "
                f"freeride's hook is tested with torch {TESTED_TORCH}"
            )
    return schedules


def _install_hook() -> None:
    global _hook_users
    schedules = _schedules_module()
    with _hook_lock:
        _hook_users += 1
        if _hook_users > 1:
            return
        wait, batch = schedules._wait_batch_p2p, schedules._batch_p2p
        _originals.update(wait=wait, batch=batch)

        @functools.wraps(wait)
        def hooked_wait(works: list[Any]) -> None:
            active = getattr(_local, "active", None)
            if active is None:
                return wait(works)
            return active.wait(wait, works)

        @functools.wraps(batch)
        def hooked_batch(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
            works = batch(p2p_ops, desc)
            active = getattr(_local, "active", None)
            if active is not None:
                active.batched(p2p_ops, works)
            return works

        schedules._wait_batch_p2p = hooked_wait
        schedules._batch_p2p = hooked_batch


def _remove_hook() -> None:
    global _hook_users
    schedules = _schedules_module()
    with _hook_lock:
        _hook_users -= 1
        if _hook_users == 0:
            schedules._wait_batch_p2p = _originals.pop("wait")
            schedules._batch_p2p = _originals.pop("batch")


def _stages_of(schedule: Any) -> list[Any]:
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        stages = [stage] if stage is not None else []
    if not stages:
        raise HookUnavailableError(f"{type(schedule).__name__} has no pipeline stages to instrument")
    return list(stages)


def instrument(
    schedule: Any,
    reporter: BubbleReporter | None = None,
    *,
    agent: str | None = None,
    sync_cuda: bool | None = None,
    record: bool = False,
    min_report_us: float = 1000.0,
) -> Instrumentation:
    """Report every bubble of `schedule` to the agent of this rank's GPU; `undo()` to stop.

    `reporter`: an existing BubbleReporter (default: `freeride.trainer.connect(agent)`).
    `sync_cuda`: synchronise the stream at bubble edges (default: when the stage is on CUDA).
    `record`: also keep every bubble in `Instrumentation.bubbles`.
    `min_report_us`: a wait shorter than this in the previous iteration is not reported.
    """
    _schedules_module()
    stages = _stages_of(schedule)
    device = getattr(stages[0], "device", None)
    sync = stream_sync(device, sync_cuda)
    if reporter is None:
        first = stages[0]
        reporter = connect(agent, stage=int(getattr(first, "stage_index", 0)))
    tracker = WaitTracker(reporter, sync, record, int(min_report_us * 1000), free_memory=free_memory(device))
    inst = Instrumentation(schedule, tracker)
    _install_hook()
    inst._undo.append(_remove_hook)
    for stage in stages:
        for name, direction in (("get_fwd_recv_ops", FWD), ("get_bwd_recv_ops", BWD)):
            bound = getattr(stage, name)

            def tagged(*a: Any, _bound: Any = bound, _direction: int = direction, **k: Any) -> list[Any]:
                return inst.tag(_bound(*a, **k), _direction)

            setattr(stage, name, tagged)
            inst._undo.append(functools.partial(restore_attribute, stage, name))
    original_step = schedule.step
    schedule.step = functools.partial(inst._run_step, original_step)
    inst._undo.append(functools.partial(restore_attribute, schedule, "step"))
    return inst

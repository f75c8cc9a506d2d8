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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from freeride.errors import FreerideError
from freeride.trainer.connect import connect
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import trainer_pb2

log = logging.getLogger(__name__)

TESTED_TORCH = ">=2.13,<2.14"
BETWEEN_STEPS_SLOT = 1 << 20  # the gap between two step() calls: optimizer, data loading

FILL, WARMUP, DRAIN, COOLDOWN, BETWEEN = (
    trainer_pb2.BUBBLE_KIND_FILL,
    trainer_pb2.BUBBLE_KIND_WARMUP,
    trainer_pb2.BUBBLE_KIND_DRAIN,
    trainer_pb2.BUBBLE_KIND_COOLDOWN,
    trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS,
)
_FWD, _BWD = 1, 2


class HookUnavailableError(FreerideError):
    """This torch version does not have the hook point freeride instruments."""


@dataclass
class BubbleRecord:
    """One reported bubble, kept when `record=True` (tests, benchmarks, timelines)."""

    iteration: int
    slot: int
    kind: int
    start_ns: int
    end_ns: int
    reported: bool = True


_local = threading.local()  # .active: the Instrumentation whose step() runs on this thread


@dataclass
class Instrumentation:
    schedule: Any
    reporter: BubbleReporter
    sync: Callable[[], None] | None
    record: bool = False
    min_report_ns: int = 200_000
    enabled: bool = True  # False: step() runs exactly as without freeride (for A/B measurements)
    iteration: int = -1
    bubbles: list[BubbleRecord] = field(default_factory=list)
    waits_seen: int = 0
    _ordinal: int = 0
    _seen_bwd: bool = False
    _tagged_ops: dict[int, int] = field(default_factory=dict)
    _tagged_works: dict[int, int] = field(default_factory=dict)
    _after_step_ns: int = 0
    _last_ns: dict[int, int] = field(default_factory=dict)  # slot -> its length last iteration
    _undo: list[Callable[[], None]] = field(default_factory=list)

    # -- the wrapped step() ------------------------------------------------------------------------
    def _run_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            self._after_step_ns = 0
            return original(*args, **kwargs)
        now = time.monotonic_ns()
        if self._after_step_ns:
            self.reporter.end(BETWEEN_STEPS_SLOT, BETWEEN)
            self._keep(BETWEEN_STEPS_SLOT, BETWEEN, self._after_step_ns, now)
        self.iteration += 1
        self.reporter.set_iteration(self.iteration)
        self._ordinal = 0
        self._seen_bwd = False
        self._tagged_ops.clear()
        self._tagged_works.clear()
        previous = getattr(_local, "active", None)
        _local.active = self
        try:
            return original(*args, **kwargs)
        finally:
            _local.active = previous
            if self.sync is not None:
                self.sync()
            self._after_step_ns = time.monotonic_ns()
            self.reporter.start(BETWEEN_STEPS_SLOT, BETWEEN)
            if self.iteration == 0:
                self._check_fired()

    def _check_fired(self) -> None:
        """The hook is private to torch: say so plainly if a multi-rank step went by without a wait."""
        import torch
        import torch.distributed as dist

        if self.waits_seen == 0 and dist.is_initialized() and dist.get_world_size() > 1:
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
        slot = self._ordinal
        self._ordinal += 1
        self.waits_seen += 1
        kind = self._kind(direction)
        # A wait that was too short to harvest last iteration is not reported (it keeps its slot
        # number): a side task could not use it, and every edge costs the agent some CPU.
        report = self._last_ns.get(slot, self.min_report_ns) >= self.min_report_ns
        if self.sync is not None:
            self.sync()  # the GPU has finished what was queued before the wait
        start = time.monotonic_ns()
        if report:
            self.reporter.start(slot, kind)
        try:
            original(works)
            if self.sync is not None:
                self.sync()  # the received data has landed
        finally:
            end = time.monotonic_ns()
            if report:
                self.reporter.end(slot, kind)
            self._last_ns[slot] = end - start
            self._keep(slot, kind, start, end, report)

    def _kind(self, direction: int) -> int:
        if direction & _BWD:
            kind = COOLDOWN if self._seen_bwd else WARMUP
            self._seen_bwd = True
            return kind
        if direction & _FWD:
            return COOLDOWN if self._seen_bwd else FILL
        return DRAIN  # only sends: waiting for a neighbour to take what this stage produced

    def _keep(self, slot: int, kind: int, start: int, end: int, reported: bool = True) -> None:
        if self.record:
            self.bubbles.append(BubbleRecord(self.iteration, slot, kind, start, end, reported))

    def undo(self) -> None:
        """Restore the schedule and the stages; the shared module hook stays while others use it."""
        while self._undo:
            self._undo.pop()()

    def close(self) -> None:
        """undo() and close the reporter (flushing what is queued)."""
        self.undo()
        self.reporter.close()


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


def _cuda_sync(stages: list[Any]) -> Callable[[], None] | None:
    device = getattr(stages[0], "device", None)
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return lambda: torch.cuda.current_stream(device).synchronize()


def instrument(
    schedule: Any,
    reporter: BubbleReporter | None = None,
    *,
    agent: str | None = None,
    sync_cuda: bool | None = None,
    record: bool = False,
    min_report_us: float = 200.0,
) -> Instrumentation:
    """Report every bubble of `schedule` to the agent of this rank's GPU; `undo()` to stop.

    `reporter`: an existing BubbleReporter (default: `freeride.trainer.connect(agent)`).
    `sync_cuda`: synchronise the stream at bubble edges (default: when the stage is on CUDA).
    `record`: also keep every bubble in `Instrumentation.bubbles`.
    `min_report_us`: a wait shorter than this in the previous iteration is not reported.
    """
    _schedules_module()
    stages = _stages_of(schedule)
    sync = _cuda_sync(stages) if sync_cuda in (None, True) else None
    if reporter is None:
        first = stages[0]
        reporter = connect(agent, stage=int(getattr(first, "stage_index", 0)))
    inst = Instrumentation(schedule, reporter, sync, record, min_report_ns=int(min_report_us * 1000))
    _install_hook()
    inst._undo.append(_remove_hook)
    for stage in stages:
        for name, direction in (("get_fwd_recv_ops", _FWD), ("get_bwd_recv_ops", _BWD)):
            bound = getattr(stage, name)

            def tagged(*a: Any, _bound: Any = bound, _direction: int = direction, **k: Any) -> list[Any]:
                return inst.tag(_bound(*a, **k), _direction)

            setattr(stage, name, tagged)
            inst._undo.append(functools.partial(_restore, stage, name))
    original_step = schedule.step
    schedule.step = functools.partial(inst._run_step, original_step)
    inst._undo.append(functools.partial(_restore, schedule, "step"))
    return inst


def _restore(obj: Any, name: str) -> None:
    """Drop the instance attribute that shadowed the class's method."""
    obj.__dict__.pop(name, None)

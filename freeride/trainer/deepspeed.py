"""Instrument a DeepSpeed PipelineEngine: its receives and its end-of-batch drain become bubbles.

    from freeride.trainer.deepspeed import instrument
    engine, *_ = deepspeed.initialize(model=pipeline_module, ...)
    handle = instrument(engine)   # finds the agent of this rank's GPU; handle.undo() to stop

`PipelineEngine._exec_schedule` looks instructions up in `_INSTRUCTION_MAP`, a class attribute
that holds the functions captured when the class was defined, so overriding a method does
nothing. This module gives the engine instance its own map with the receive (and send)
instructions wrapped, and wraps `train_batch` (one iteration). The drain (a stage that finished its last
backward waiting for the others) hides in the optimizer step: gradient clipping all-reduces the
global gradient norm across the pipeline, so `deepspeed.comm.all_reduce` is wrapped while this
engine's OptimizerStep runs, and `_aggregate_total_loss` (the loss broadcast) is wrapped too.
Nothing changes for other engines in the process.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from time import monotonic_ns
from typing import Any

from freeride.errors import FreerideError
from freeride.trainer._connect import connect
from freeride.trainer._cuda import free_memory, sends_block
from freeride.trainer.edges import clock_for, resolve_mode
from freeride.trainer.reporter import BubbleReporter, Pipeline
from freeride.trainer.waits import (
    BWD,
    DEFAULT_QUIET_SAMPLE_MS,
    END_OF_STEP,
    FWD,
    Instrumented,
    WaitTracker,
    restore_attribute,
)

TESTED_DEEPSPEED = ">=0.19,<0.20"

__all__ = ["TESTED_DEEPSPEED", "DeepSpeedInstrumentation", "instrument", "sends_block"]


class DeepSpeedHookError(FreerideError):
    """This DeepSpeed version does not have the hook points freeride instruments."""


_local = threading.local()  # .optimizer_step: the instrumentation whose OptimizerStep runs here
_hook_lock = threading.Lock()
_hook_users = 0
_original_all_reduce: Callable[..., Any] | None = None


def _install_all_reduce_hook() -> None:
    global _hook_users, _original_all_reduce
    from deepspeed import comm

    with _hook_lock:
        _hook_users += 1
        if _hook_users > 1:
            return
        original = _original_all_reduce = comm.all_reduce

        @functools.wraps(original)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            inst = getattr(_local, "optimizer_step", None)  # set by a timed step's OptimizerStep only
            if inst is None:
                return original(*args, **kwargs)
            return inst.tracker.wait(END_OF_STEP, lambda: original(*args, **kwargs))

        comm.all_reduce = all_reduce


def _remove_all_reduce_hook() -> None:
    global _hook_users, _original_all_reduce
    from deepspeed import comm

    with _hook_lock:
        _hook_users -= 1
        if _hook_users == 0 and _original_all_reduce is not None:
            comm.all_reduce = _original_all_reduce
            _original_all_reduce = None


class DeepSpeedInstrumentation(Instrumented):
    def __init__(self, engine: Any, tracker: WaitTracker) -> None:
        super().__init__(tracker)
        self.engine = engine
        # The engine's instance attributes that hook it, and what they are set to for a step that is not timed (the
        # engine's own map and method): the keys stay in the instance's dict, so swapping them leaves its shape as
        # it is (CPython specialises attribute reads on the dict's keys, which a step's `self.` reads all use).
        self._hooks: dict[str, Any] = {}
        self._unhooked: dict[str, Any] = {}
        self._hooked = False

    def _train_batch(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tracker = self.tracker
        if not tracker.enabled or not tracker.timed():
            if self._hooked:  # a step freeride does not time runs on the engine's own instructions: no hook at all
                self._hooked = False
                self.engine.__dict__.update(self._unhooked)
            tracker.skip_step()
            return original(*args, **kwargs)
        if not self._hooked:
            self._hooked = True
            self.engine.__dict__.update(self._hooks)
        tracker.begin_step()
        try:
            return original(*args, **kwargs)
        finally:
            tracker.end_step()

    def _around(self, direction: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        tracker = self.tracker

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:  # no closure made per call: it runs ~35 times a step
            # In the engine's map only while a step is timed (_train_batch swaps it): no `enabled` check here.
            log = tracker.quiet_log
            if log is not None:  # the agent is quiet: only timed here, reported at the step's end (WaitTracker)
                start = monotonic_ns()
                try:
                    return fn(*args, **kwargs)
                finally:
                    log += (direction, start, monotonic_ns())
            token = tracker.begin_wait(direction)
            try:
                return fn(*args, **kwargs)
            finally:
                tracker.end_wait(token)

        return wrapped

    def _optimizer_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            previous = getattr(_local, "optimizer_step", None)
            _local.optimizer_step = self
            try:
                return fn(*args, **kwargs)
            finally:
                _local.optimizer_step = previous

        return wrapped


def instrument(
    engine: Any,
    reporter: BubbleReporter | None = None,
    *,
    agent: str | None = None,
    sync_cuda: bool | None = None,
    edge_sync: str | None = None,
    record: bool = False,
    min_report_us: float = 1000.0,
    quiet_sample_ms: float = DEFAULT_QUIET_SAMPLE_MS,
) -> DeepSpeedInstrumentation:
    """Report the bubbles of a DeepSpeed `PipelineEngine` to the agent of this rank's GPU.

    `edge_sync`: how bubble edges are taken on CUDA, "stream" | "event" | "off" (default
    $FREERIDE_EDGE_SYNC, else "event"; see freeride.trainer.edges). `sync_cuda=False` means "off".
    `quiet_sample_ms`: while no agent listens (none is connected yet, or it is quiet: no task could use a
    bubble seen so far), a CPU stage times one step every that many milliseconds (default 500) and runs the
    others unhooked; 0: every step (see freeride.trainer.waits). The profile's per-iteration figures stay
    exact, and each timed step tells the agent how many steps it stands for, so its bubble counters (stats,
    /metrics) stay whole. Once a task could use a bubble, every step is timed from the next one on. The
    reporter connects on its own thread: nothing here waits for the agent.
    """
    try:
        from deepspeed.runtime.pipe import schedule as ds_schedule
        from deepspeed.runtime.pipe.engine import PipelineEngine
    except ImportError as exc:
        raise DeepSpeedHookError(f"DeepSpeed's pipeline engine is not importable: {exc}") from None
    if not isinstance(engine, PipelineEngine):
        raise DeepSpeedHookError(f"{type(engine).__name__} is not a DeepSpeed PipelineEngine")
    base_map = getattr(type(engine), "_INSTRUCTION_MAP", None)
    if not isinstance(base_map, dict) or not all(
        hasattr(ds_schedule, n) and getattr(ds_schedule, n) in base_map for n in ("RecvActivation", "RecvGrad")
    ):
        import deepspeed

        raise DeepSpeedHookError(
            f"DeepSpeed {deepspeed.__version__} has no PipelineEngine._INSTRUCTION_MAP with RecvActivation and "
            f"RecvGrad; freeride's hook is tested with DeepSpeed {TESTED_DEEPSPEED}"
        )
    device = getattr(engine, "device", None)
    resolve_mode(device, edge_sync, sync_cuda)  # a bad edge_sync is refused before anything is connected
    # DeepSpeed's PipelineEngine runs its TrainSchedule: 1F1B over `micro_batches`.
    pipeline = Pipeline("1F1B", int(getattr(engine, "num_stages", 0) or 0),
                        int(getattr(engine, "micro_batches", 0) or 0))
    if reporter is None:
        reporter = connect(agent, stage=int(getattr(engine, "stage_id", 0)), pipeline=pipeline)
    elif isinstance(reporter, BubbleReporter) and not reporter.pipeline.schedule:
        reporter.pipeline = pipeline  # said in its next hello
    tracker = WaitTracker(reporter, clock_for(device, edge_sync, sync_cuda), record, int(min_report_us * 1000),
                          free_memory=free_memory(device), quiet_sample_ns=int(quiet_sample_ms * 1e6))
    inst = DeepSpeedInstrumentation(engine, tracker)
    wrapped = {
        ds_schedule.RecvActivation: inst._around(FWD, base_map[ds_schedule.RecvActivation]),
        ds_schedule.RecvGrad: inst._around(BWD, base_map[ds_schedule.RecvGrad]),
    }
    if sends_block(device):
        for name in ("SendActivation", "SendGrad"):
            cls = getattr(ds_schedule, name, None)
            if cls in base_map:
                wrapped[cls] = inst._around(0, base_map[cls])
    if getattr(ds_schedule, "OptimizerStep", None) in base_map:
        wrapped[ds_schedule.OptimizerStep] = inst._optimizer_step(base_map[ds_schedule.OptimizerStep])
        _install_all_reduce_hook()
        inst._undo.append(_remove_all_reduce_hook)
    inst._hooks["_INSTRUCTION_MAP"] = {**base_map, **wrapped}
    inst._unhooked["_INSTRUCTION_MAP"] = base_map
    if not engine.is_last_stage():
        aggregate = inst._unhooked["_aggregate_total_loss"] = engine._aggregate_total_loss
        inst._hooks["_aggregate_total_loss"] = inst._around(END_OF_STEP, aggregate)
    for name in inst._hooks:
        inst._undo.append(functools.partial(restore_attribute, engine, name))
    engine.__dict__.update(inst._hooks)
    inst._hooked = True
    engine.train_batch = functools.partial(inst._train_batch, engine.train_batch)
    inst._undo.append(functools.partial(restore_attribute, engine, "train_batch"))
    return inst

"""Instrument a torch.distributed.pipelining schedule: every receive wait becomes a reported bubble.

    from freeride.trainer.torch_pipelining import instrument
    handle = instrument(schedule)   # finds the agent of this rank's GPU
    ...                             # schedule.step(...) as before
    handle.undo()

All schedules (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble,
DualPipeV) wait for their peers in one private module function, `_wait_batch_p2p`; this module
wraps it (and `_batch_p2p`, to learn what each wait is for), and wraps the public `step()` to
number the waits of each iteration. The k-th wait of a step is slot k, so the same bubble gets
the same slot in every iteration. Some releases have other modules of the package that import
those functions by name (`from .schedules import _wait_batch_p2p`): the hook replaces the name in
every module of torch.distributed.pipelining that holds it, or those schedules' waits would go
unseen. On CUDA an NCCL wait does not block the CPU, so the edges are taken by `edge_sync`:
a CUDA event watched off the training thread (default), the stream synchronised around the wait,
or none (freeride.trainer.edges). On gloo the CPU wait is exact.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import pkgutil
import sys
import threading
from collections.abc import Callable
from typing import Any

from freeride.errors import FreerideError
from freeride.trainer._connect import connect
from freeride.trainer._cuda import free_memory
from freeride.trainer.edges import clock_for, resolve_mode
from freeride.trainer.reporter import BubbleReporter, Pipeline
from freeride.trainer.waits import BWD, FWD, BubbleRecord, Instrumented, WaitTracker, restore_attribute

log = logging.getLogger(__name__)

TESTED_TORCH = ">=2.11,<2.16"  # README: which release was checked how
_PACKAGE = "torch.distributed.pipelining"
_HOOKED = ("_wait_batch_p2p", "_batch_p2p")

__all__ = ["TESTED_TORCH", "BubbleRecord", "HookUnavailableError", "Instrumentation", "hook_points", "instrument"]


class HookUnavailableError(FreerideError):
    """This torch version does not have the hook point freeride instruments."""


_local = threading.local()  # .active: the Instrumentation whose step() runs on this thread


class Instrumentation(Instrumented):
    def __init__(self, schedule: Any, tracker: WaitTracker, stages: list[Any] | None = None) -> None:
        super().__init__(tracker)
        self.schedule = schedule
        self.stages = stages or []
        self.checked = False  # whether a step() has completed (and been checked for waits)
        self._tagged_ops: dict[int, int] = {}
        self._tagged_works: dict[int, int] = {}
        self.batch_depth = 0  # nested _batch_p2p calls in progress

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
            result = original(*args, **kwargs)
        finally:  # a step that raised is the training's exception: it goes up as it is, the hooks stay
            _local.active = previous
            tracker.end_step()
        if not self.checked:
            self.checked = True
            self._check_fired()
        return result

    def _check_fired(self) -> None:
        """The hook is private to torch: say so plainly if the first step() that completed, in a pipeline of more
        than one rank, went by without a single wait reaching it (and stop costing the step anything)."""
        if self.tracker.waits_seen or self._pipeline_ranks() <= 1:
            return
        import torch

        with _hook_lock:
            holders = sorted({m.__name__ for m, n, _ in _patched if n == "_wait_batch_p2p"})
        log.error(
            "freeride saw no pipeline wait in the first completed step() of %s (a pipeline of %d ranks; torch %s, "
            "freeride's hook is tested with torch %s): it looks for calls of _wait_batch_p2p with works to wait on, "
            "hooked in %s, and none came. Bubbles cannot be reported, so the instrumentation is removed; training "
            "goes on unchanged. If this torch waits for pipeline peers elsewhere, report it to freeride with the "
            "output of: python -c 'from freeride.trainer.torch_pipelining import hook_points; print(hook_points())'",
            type(self.schedule).__name__, self._pipeline_ranks(), torch.__version__, TESTED_TORCH,
            ", ".join(holders) or "no module",
        )
        self.undo()

    def _pipeline_ranks(self) -> int:
        """The ranks of this pipeline (the stage's group), else of the world: one rank alone waits for nobody."""
        ranks = int(getattr(self.stages[0], "group_size", 0) or 0) if self.stages else 0
        if ranks:
            return ranks
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

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
_patched: list[tuple[Any, str, Callable[..., Any]]] = []  # (module, name, original) to put back


def _schedules_module() -> Any:
    try:
        import torch
        import torch.distributed.pipelining.schedules as schedules
    except ImportError as exc:
        raise HookUnavailableError(f"torch.distributed.pipelining is not importable: {exc}") from None
    for name in _HOOKED:
        if not callable(getattr(schedules, name, None)):
            raise HookUnavailableError(
                f"torch {torch.__version__} has no {_PACKAGE}.schedules.{name}; "
                f"freeride's hook is tested with torch {TESTED_TORCH}"
            )
    return schedules


def _import_holders() -> None:
    """Import every module of the package whose source names a hooked function (a `runtime.py` of some
    releases imports them by name), so that the hook can replace the name there too."""
    package = sys.modules[_PACKAGE]
    for info in pkgutil.iter_modules(package.__path__, _PACKAGE + "."):
        if info.name in sys.modules:
            continue
        spec = importlib.util.find_spec(info.name)
        origin = getattr(spec, "origin", None)
        try:
            with open(origin or "", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        if any(name in text for name in _HOOKED):
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # an optional module (a visualiser, say) that cannot import here holds no wait
                log.debug("freeride: %s not imported: %s", info.name, exc)


def _holders(function: Callable[..., Any], name: str) -> list[Any]:
    return [mod for key, mod in list(sys.modules.items())
            if (key == _PACKAGE or key.startswith(_PACKAGE + ".")) and getattr(mod, name, None) is function]


def hook_points() -> dict[str, Any]:
    """What the hook replaces in this process's torch: each hooked name and the modules that hold it."""
    import torch

    schedules = _schedules_module()
    _import_holders()
    with _hook_lock:
        functions = {"_wait_batch_p2p": _originals.get("wait", schedules._wait_batch_p2p),
                     "_batch_p2p": _originals.get("batch", schedules._batch_p2p)}
        held = {name: sorted(m.__name__ for m in _holders(fn, name)) for name, fn in functions.items()}
    if _hook_users:  # the hooked copies stand where the originals were
        held = {name: sorted({m.__name__ for m, n, _ in _patched if n == name}) for name in functions}
    return {"torch": torch.__version__, "tested": TESTED_TORCH, "modules": held}


def _install_hook() -> None:
    global _hook_users
    schedules = _schedules_module()
    _import_holders()
    with _hook_lock:
        _hook_users += 1
        if _hook_users > 1:
            return
        wait, batch = schedules._wait_batch_p2p, schedules._batch_p2p
        _originals.update(wait=wait, batch=batch)

        @functools.wraps(wait)
        def hooked_wait(works: Any) -> None:
            active = getattr(_local, "active", None)
            if active is None:
                return wait(works)
            return active.wait(wait, works)

        @functools.wraps(batch)
        def hooked_batch(p2p_ops: list[Any], *args: Any, **kwargs: Any) -> Any:
            active = getattr(_local, "active", None)
            if active is None:
                return batch(p2p_ops, *args, **kwargs)
            # torch >= 2.14 calls _batch_p2p again for each process group of a mixed batch (through the
            # module's name, so through this hook): the outermost call's works are what gets waited on.
            active.batch_depth += 1
            try:
                works = batch(p2p_ops, *args, **kwargs)
            finally:
                active.batch_depth -= 1
            if active.batch_depth == 0:
                active.batched(p2p_ops, works)
            return works

        for name, original, hooked in (("_wait_batch_p2p", wait, hooked_wait), ("_batch_p2p", batch, hooked_batch)):
            for mod in _holders(original, name):
                setattr(mod, name, hooked)
                _patched.append((mod, name, original))


def _remove_hook() -> None:
    global _hook_users
    with _hook_lock:
        _hook_users -= 1
        if _hook_users == 0:
            while _patched:
                mod, name, original = _patched.pop()
                setattr(mod, name, original)
            _originals.clear()


def _stages_of(schedule: Any) -> list[Any]:
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        stages = [stage] if stage is not None else []
    if not stages:
        raise HookUnavailableError(f"{type(schedule).__name__} has no pipeline stages to instrument")
    for stage in stages:
        for name in ("get_fwd_recv_ops", "get_bwd_recv_ops"):
            if not callable(getattr(stage, name, None)):
                import torch

                raise HookUnavailableError(
                    f"{type(stage).__name__} of torch {torch.__version__} has no {name}(); "
                    f"freeride's hook is tested with torch {TESTED_TORCH}")
    return list(stages)


def declared_pipeline(schedule: Any, stages: list[Any]) -> Pipeline:
    """The schedule's name (`ScheduleInterleaved1F1B` -> "Interleaved1F1B"), p (the pipeline group's ranks), m and
    the stages this rank holds, as its hello declares them; what the schedule does not say is left 0."""
    name = type(schedule).__name__.removeprefix("Schedule")
    ranks = int(getattr(stages[0], "group_size", 0) or 0)
    microbatches = int(getattr(schedule, "_n_microbatches", 0) or 0)
    return Pipeline(name, ranks, microbatches, len(stages))


def instrument(
    schedule: Any,
    reporter: BubbleReporter | None = None,
    *,
    agent: str | None = None,
    sync_cuda: bool | None = None,
    edge_sync: str | None = None,
    record: bool = False,
    min_report_us: float = 1000.0,
) -> Instrumentation:
    """Report every bubble of `schedule` to the agent of this rank's GPU; `undo()` to stop.

    `reporter`: an existing BubbleReporter (default: `freeride.trainer.connect(agent)`).
    `edge_sync`: how bubble edges are taken on CUDA: "stream" (synchronise the stream around each
    wait), "event" (a CUDA event watched off the training thread) or "off" (CPU times); default
    $FREERIDE_EDGE_SYNC, else "event". `sync_cuda=False` (older flag) means "off".
    `record`: also keep every bubble in `Instrumentation.bubbles`.
    `min_report_us`: a wait shorter than this in the previous iteration is not reported.
    """
    _schedules_module()
    stages = _stages_of(schedule)
    device = getattr(stages[0], "device", None)
    resolve_mode(device, edge_sync, sync_cuda)  # a bad edge_sync is refused before anything is connected
    pipeline = declared_pipeline(schedule, stages)
    if reporter is None:
        first = stages[0]
        reporter = connect(agent, stage=int(getattr(first, "stage_index", 0)), pipeline=pipeline)
    elif isinstance(reporter, BubbleReporter) and not reporter.pipeline.schedule:
        reporter.pipeline = pipeline  # said in its next hello
    tracker = WaitTracker(reporter, clock_for(device, edge_sync, sync_cuda), record, int(min_report_us * 1000),
                          free_memory=free_memory(device))
    inst = Instrumentation(schedule, tracker, stages)
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

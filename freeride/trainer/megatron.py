"""Instrument Megatron-Core's pipeline schedules through `config.timers`: no change to Megatron code.

    from freeride.trainer.megatron import instrument
    handle = instrument(config)   # the ModelParallelConfig handed to the forward-backward function
    ...
    handle.undo()

Every P2P call in `megatron.core.pipeline_parallel.p2p_communication` runs between
`config.timers("<name>", log_level=2).start()` and `.stop()` (`forward-recv`, `backward-recv`,
`forward-send-backward-recv`, ...), and the whole step between `forward-backward` start and
stop. A timers object that turns the receiving calls into bubble edges and the step into an
iteration is all it takes; an existing timers object keeps working (calls are forwarded).
On a CPU stage (gloo) a send blocks until the neighbour takes the data, so the sending timers
(`forward-send`, `backward-send`) are timed too, as DeepSpeed's sends are (`sends_block`); on CUDA
an NCCL send is queued on the stream and returns at once, and they are left alone.
With the default `batch_p2p_sync=True`, Megatron synchronises the device after each receive,
so the CPU-side END is GPU-accurate; START synchronises the stream first so that it marks the
moment the GPU drained. Tested with megatron-core 0.16.1's real 1F1B and interleaved schedules on
CPU (gloo; tests/integration/trainers/test_megatron_schedules.py, whose harness answers Megatron's own CUDA
calls on the CPU); the CUDA path (`batch_p2p_sync`, CUDA edges, NCCL) is yet to run on a GPU.
"""

from __future__ import annotations

from typing import Any

from freeride.trainer._connect import connect
from freeride.trainer._cuda import free_memory, sends_block
from freeride.trainer.edges import clock_for, resolve_mode
from freeride.trainer.reporter import BubbleReporter
from freeride.trainer.waits import BWD, FWD, Instrumented, WaitTracker

STEP_TIMER = "forward-backward"
#: Megatron-Core's P2P timer names that wait for data, and what they receive.
RECEIVING_TIMERS = {
    "forward-recv": FWD,
    "backward-recv": BWD,
    "forward-send-backward-recv": BWD,
    "backward-send-forward-recv": FWD,
    "forward-send-forward-recv": FWD,
    "backward-send-backward-recv": BWD,
    "forward-backward-send-forward-backward-recv": FWD | BWD,
}
#: The timers around a send alone (0: a wait that receives nothing): timed on a CPU stage only, where a gloo send
#: waits for the neighbour to take the data.
SENDING_TIMERS = {"forward-send": 0, "backward-send": 0}

__all__ = ["RECEIVING_TIMERS", "SENDING_TIMERS", "MegatronInstrumentation", "instrument"]


class _NullTimer:
    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass


class _EdgeTimer:
    """One named timer: forwards to Megatron's own timer and reports the wait around it."""

    def __init__(self, owner: FreerideTimers, name: str, inner: Any) -> None:
        self._owner = owner
        self._name = name
        self._inner = inner
        self._token: tuple[int, int, bool, int] | None = None

    def start(self, barrier: bool = False) -> None:
        self._inner.start(barrier=barrier)
        self._owner._started(self)

    def stop(self, barrier: bool = False) -> None:
        self._owner._stopped(self)
        self._inner.stop(barrier=barrier)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FreerideTimers:
    """A Megatron `timers` callable that also reports bubbles; everything else goes to `inner`."""

    def __init__(self, tracker: WaitTracker, inner: Any = None, *, time_sends: bool = False) -> None:
        self.tracker = tracker
        self.inner = inner
        self._timers: dict[str, _EdgeTimer] = {}
        # timer name -> what its wait receives: the receiving timers, and the sending ones where sends block
        self._waits = {**RECEIVING_TIMERS, **SENDING_TIMERS} if time_sends else RECEIVING_TIMERS

    def __call__(self, name: str, log_level: int | None = None) -> _EdgeTimer:
        timer = self._timers.get(name)
        if timer is None:
            if self.inner is None:
                inner: Any = _NullTimer()
            elif log_level is None:
                inner = self.inner(name)
            else:
                inner = self.inner(name, log_level=log_level)
            timer = self._timers[name] = _EdgeTimer(self, name, inner)
        return timer

    def __getattr__(self, name: str) -> Any:  # log(), write(), ... of Megatron's Timers
        if self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _started(self, timer: _EdgeTimer) -> None:
        t = self.tracker
        if not t.enabled:
            return
        if timer._name == STEP_TIMER:
            t.begin_step()
        else:
            direction = self._waits.get(timer._name)
            if direction is not None:
                timer._token = t.begin_wait(direction)

    def _stopped(self, timer: _EdgeTimer) -> None:
        t = self.tracker
        if timer._token is not None:
            t.end_wait(timer._token)
            timer._token = None
        elif timer._name == STEP_TIMER and t.enabled:
            t.end_step()


class MegatronInstrumentation(Instrumented):
    def __init__(self, config: Any, timers: FreerideTimers, previous: Any) -> None:
        super().__init__(timers.tracker)
        self.config = config
        self.timers = timers
        self._undo.append(self._restore_timers)
        self._previous = previous

    def _restore_timers(self) -> None:
        if self.config.timers is self.timers:
            self.config.timers = self._previous


def instrument(
    config: Any,
    reporter: BubbleReporter | None = None,
    *,
    agent: str | None = None,
    device: Any = None,
    record: bool = False,
    min_report_us: float = 1000.0,
    stage: int = 0,
    edge_sync: str | None = None,
) -> MegatronInstrumentation:
    """Report the bubbles of the Megatron-Core schedules that use `config` (a ModelParallelConfig).

    `device`: the rank's CUDA device (default: the current one, when CUDA is available); without one the
    stage is a CPU one, whose sends (gloo) are timed as waits too.
    `edge_sync`: how bubble edges are taken on CUDA, "stream" | "event" | "off" (default
    $FREERIDE_EDGE_SYNC, else "event"; see freeride.trainer.edges).
    """
    if not hasattr(config, "timers"):
        raise TypeError(f"{type(config).__name__} has no `timers` attribute: pass Megatron's ModelParallelConfig")
    if device is None:
        device = _current_cuda_device()
    resolve_mode(device, edge_sync)  # a bad edge_sync is refused before anything is connected
    if reporter is None:
        reporter = connect(agent, stage=stage)
    tracker = WaitTracker(reporter, clock_for(device, edge_sync), record, int(min_report_us * 1000),
                          free_memory=free_memory(device))
    previous = config.timers
    timers = FreerideTimers(tracker, previous, time_sends=sends_block(device))
    config.timers = timers
    return MegatronInstrumentation(config, timers, previous)


def _current_cuda_device() -> Any:
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None

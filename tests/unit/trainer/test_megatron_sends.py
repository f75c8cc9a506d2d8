"""Which Megatron-Core stages have their sending timers timed: on a CPU stage a gloo send blocks until the neighbour
takes the data (idle time, a wait like DeepSpeed's sends); on CUDA an NCCL send is queued on the stream and returns
at once, so `forward-send` / `backward-send` are left alone there."""

from __future__ import annotations

import types
from typing import Any

import pytest

from freeride.trainer import megatron
from freeride.trainer.waits import BETWEEN_STEPS_SLOT, COOLDOWN, DRAIN, WARMUP


class _Reporter:
    """A reporter that keeps the edges it is given (a CPU stage's are reported on the training thread)."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, int]] = []

    def start(self, slot: int, kind: int, **_: Any) -> None:
        self.starts.append((slot, kind))

    def end(self, slot: int, kind: int, **_: Any) -> None:
        pass

    def hold(self) -> bool:
        return False  # an agent that listens: every wait is reported as it happens

    def set_iteration(self, iteration: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _one_step(config: Any) -> None:
    """The first stage of a 1F1B step, as megatron-core 0.16.1's schedule times it (compute timers included)."""
    config.timers("forward-backward", log_level=1).start()
    for name in ("forward-compute", "forward-send", "forward-compute", "forward-send-backward-recv",
                 "backward-compute", "backward-recv"):
        timer = config.timers(name, log_level=2)
        timer.start()
        timer.stop()
    config.timers("forward-backward").stop()


def _waits(reporter: _Reporter) -> list[int]:
    return [kind for slot, kind in reporter.starts if slot != BETWEEN_STEPS_SLOT]


def test_a_cpu_stages_sends_are_timed_waits() -> None:
    reporter = _Reporter()
    config = types.SimpleNamespace(timers=None)
    handle = megatron.instrument(config, reporter, device=None)  # type: ignore[arg-type]
    _one_step(config)
    handle.close()
    # the send waits for the neighbour to take the activation (DRAIN: only sends), then the two receives
    assert _waits(reporter) == [DRAIN, WARMUP, COOLDOWN]


def test_a_cuda_stages_sends_are_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(megatron, "free_memory", lambda device: None)  # no GPU here to ask
    reporter = _Reporter()
    config = types.SimpleNamespace(timers=None)
    cuda = types.SimpleNamespace(type="cuda", index=0)
    handle = megatron.instrument(config, reporter, device=cuda, edge_sync="off")  # type: ignore[arg-type]
    _one_step(config)
    handle.close()
    assert _waits(reporter) == [WARMUP, COOLDOWN]  # the receives only

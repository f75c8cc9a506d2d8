"""Megatron-Core's timers hook, driven with the call sequence Megatron's 1F1B schedule makes.

A rank's timer calls are replayed (stage 1 of p=4, m=4) against a real agent, and the waits are real
sleeps; tests/integration/trainers/test_megatron_schedules.py runs Megatron's real schedules (2 ranks, gloo).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from freeride.tooling.harness import AgentProcess
from freeride.trainer.megatron import instrument
from freeride.trainer.reporter import BubbleReporter
from freeride.v1 import trainer_pb2

K = trainer_pb2


class RecordingTimers:
    """Stands for Megatron's own Timers: freeride must keep feeding it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name: str, log_level: int | None = None) -> SimpleNamespace:
        return SimpleNamespace(start=lambda barrier=False: self.calls.append((name, "start")),
                               stop=lambda barrier=False: self.calls.append((name, "stop")))

    def log(self, names: list[str]) -> str:
        return f"logged {names}"


# (timer name, seconds inside it) for one iteration of stage 1 (p=4, m=4): warm-up recv/send,
# steady send-forward-recv-backward / send-backward-recv-forward, cool-down recv-backward.
ITERATION = [
    ("forward-recv", 0.010), ("forward-send", 0.0005),
    ("forward-recv", 0.004), ("forward-send-backward-recv", 0.040),
    ("backward-send-forward-recv", 0.002), ("forward-send-backward-recv", 0.003),
    ("backward-send-forward-recv", 0.002), ("forward-send-backward-recv", 0.003),
    ("backward-recv", 0.010), ("backward-send", 0.0005), ("backward-recv", 0.010), ("backward-send", 0.0005),
]


def run_iterations(config: SimpleNamespace, iterations: int) -> None:
    for _ in range(iterations):
        config.timers("forward-backward", log_level=1).start()
        for name, seconds in ITERATION:
            timer = config.timers(name, log_level=2)
            timer.start()
            time.sleep(seconds)
            timer.stop()
            time.sleep(0.002)  # compute between P2P calls
        config.timers("forward-backward", log_level=1).stop()


def test_megatron_receive_timers_become_bubbles_and_megatrons_timers_keep_working(tmp_path) -> None:
    with AgentProcess(state_dir=tmp_path / "state") as agent, agent.client() as client:
        inner = RecordingTimers()
        config = SimpleNamespace(timers=inner)
        handle = instrument(config, BubbleReporter(agent.target, rank=1, stage=1), record=True)
        assert handle.reporter.wait_connected(10)
        run_iterations(config, 4)
        handle.close()
        assert config.timers is inner  # undo() gave Megatron its timers back
        assert config.timers.log(["x"]) == "logged ['x']"
        gpu = client.stats().gpu
    assert len(inner.calls) == 2 * 4 * (len(ITERATION) + 1)  # every start/stop forwarded
    per_it = [[b for b in handle.bubbles if b.iteration == i and b.kind != K.BUBBLE_KIND_BETWEEN_STEPS]
              for i in range(4)]
    # A CPU stage (no device here): its gloo sends block until the neighbour takes the data, so every P2P call
    # is a wait; the sends alone are DRAIN (tests/unit/trainer/test_megatron_sends.py: not on CUDA).
    assert all(len(bs) == len(ITERATION) for bs in per_it)
    receives = [b for b, (name, _) in zip(per_it[2], ITERATION, strict=True) if "recv" in name]
    sends = [b for b, (name, _) in zip(per_it[2], ITERATION, strict=True) if "recv" not in name]
    assert {b.kind for b in sends} == {K.BUBBLE_KIND_DRAIN}
    kinds = [b.kind for b in receives]
    assert kinds[:2] == [K.BUBBLE_KIND_FILL, K.BUBBLE_KIND_FILL]
    assert kinds[2] == K.BUBBLE_KIND_WARMUP  # waiting for the first gradient
    assert set(kinds[3:]) == {K.BUBBLE_KIND_COOLDOWN}
    long_wait = receives[2]
    # The 40 ms wait, and not much more (a busy runner may oversleep; it never undersleeps).
    assert 0.035 < (long_wait.end_ns - long_wait.start_ns) / 1e9 < 0.3
    assert gpu.bubbles == sum(b.reported for bs in per_it for b in bs)
    assert gpu.rejected_events == 0


def test_a_disabled_instrumentation_reports_nothing_and_undo_restores_the_config(tmp_path) -> None:
    with AgentProcess(state_dir=tmp_path / "state") as agent:
        config = SimpleNamespace(timers=None)
        handle = instrument(config, BubbleReporter(agent.target), record=True)
        handle.tracker.enabled = False  # as for the plain half of an A/B measurement
        run_iterations(config, 1)
        assert handle.bubbles == []
        handle.close()
        assert config.timers is None

"""A real 4-rank DeepSpeed PipelineEngine run (CPU, gloo) reports its bubbles to an agent per rank."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.agents import Agents

from freeride.tooling.bench.pipeline import PipelineConfig, launch
from freeride.tooling.harness import AgentProcess
from freeride.v1 import trainer_pb2

P, M, F_MS, B_MS = 4, 4, 10.0, 20.0
BETWEEN = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS


def config(**overrides: Any) -> PipelineConfig:
    base = {"framework": "deepspeed", "stages": P, "microbatches": M, "forward_ms": F_MS, "backward_ms": B_MS,
            "iterations": 6}
    return PipelineConfig(**{**base, **overrides})


@pytest.mark.serial  # measured bubbles account for a real-time step within 20 ms
def test_deepspeed_receives_and_drain_are_reported_every_iteration(agents: Agents, tmp_path: Path) -> None:
    results = launch(config(instrument=True, socket_dir=str(agents.socket_dir)), tmp_path / "run")
    compute_ms = M * (F_MS + B_MS)
    for r, res in enumerate(results):
        iters: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for b in res["bubbles"]:
            if b["kind"] != BETWEEN:
                iters[b["iteration"]].append(b)
        shapes = {tuple((b["slot"], b["kind"]) for b in iters[it]) for it in range(1, 6)}
        assert len(shapes) == 1, f"rank {r}: waits differ between iterations"
        kinds = [kind for _, kind in next(iter(shapes))]
        if r > 0:
            assert kinds[0] == trainer_pb2.BUBBLE_KIND_FILL
        if r < P - 1:
            assert trainer_pb2.BUBBLE_KIND_WARMUP in kinds  # waits for the first gradient
            assert kinds[-1] == trainer_pb2.BUBBLE_KIND_DRAIN  # waits for the last stage at the end
        # The bubbles account for the time the rank did not compute: medians over the steady iterations,
        # so one step stretched by a busy 2-core runner does not decide.
        steady = range(2, 6)
        # The compute is what the sleeps really took (each overshoots by a wake-up on a loaded runner).
        assert all(res["compute_ms"][it] >= 0.99 * compute_ms for it in steady), (r, res["compute_ms"], compute_ms)
        unaccounted = statistics.median(
            res["step_ms"][it] - res["compute_ms"][it] - sum((b["end_ns"] - b["start_ns"]) / 1e6 for b in iters[it])
            for it in steady)
        step = statistics.median(res["step_ms"][it] for it in steady)
        assert abs(unaccounted) <= max(20.0, 0.2 * step), (r, unaccounted, step)
        gpu = agents.clients[r].stats().gpu
        assert gpu.bubbles == sum(b["reported"] for v in iters.values() for b in v)
        assert res["reporter_dropped"] == 0


@pytest.mark.background  # the same parameters and losses, however long the steps took
def test_deepspeed_training_is_bit_identical_with_and_without_freeride(agents: Agents, tmp_path: Path) -> None:
    plain = launch(config(iterations=5), tmp_path / "plain")
    instrumented = launch(config(iterations=5, instrument=True, socket_dir=str(agents.socket_dir)), tmp_path / "inst")
    for a, b in zip(plain, instrumented, strict=True):
        assert a["params_sha256"] == b["params_sha256"]
        assert a["losses"] == b["losses"]
    assert plain[-1]["losses"]


@pytest.mark.background  # which steps were timed is the configuration's, not the clock's
def test_a_quiet_agents_stage_can_time_one_step_in_a_while_and_trains_the_same(tmp_path: Path) -> None:
    """quiet_sample_ms (500 ms by default; an hour here): agents with nothing to grant, so each CPU stage times its
    first step and, the sample period being an hour, runs every later one on the engine's own instructions;
    training is unchanged."""
    base = config(stages=2, iterations=5)
    plain = launch(base, tmp_path / "plain")
    with tempfile.TemporaryDirectory(prefix="fr-ds-") as tmp, contextlib.ExitStack() as stack:
        for r in range(base.stages):  # no task submitted: the agents stay quiet
            stack.enter_context(AgentProcess(state_dir=Path(tmp) / f"state{r}", gpu=r))
        sampled = launch(PipelineConfig(**{**base.__dict__, "instrument": True, "socket_dir": tmp,
                                           "quiet_sample_ms": 3600e3}), tmp_path / "sampled")
    for a, b in zip(plain, sampled, strict=True):
        assert (a["params_sha256"], a["losses"]) == (b["params_sha256"], b["losses"])
        assert b["untimed_steps"] == base.iterations - 1, b["untimed_steps"]
        assert b["bubbles"] and {x["iteration"] for x in b["bubbles"]} == {0}, b["bubbles"]
        assert b["reporter_path"] == "shm"

"""Megatron-Core's real pipeline schedules, 2 ranks on CPU (gloo), each with its agent: `instrument(config)` unchanged.

1F1B (`forward_backward_pipelining_without_interleaving`) on 2 stages and the interleaved schedule
(`forward_backward_pipelining_with_interleaving`) on 2 stages of 2 virtual stages each, with megatron-core 0.16.1
in CI (the newest release for Python 3.11). Each rank (tests/integration/trainers/megatron_rank.py) trains the same
model twice, plain and instrumented; the only harness is its `cpu_shims` (Megatron's own CUDA calls, on the CPU).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agents import Agents

from freeride.trainer.megatron import RECEIVING_TIMERS, SENDING_TIMERS
from freeride.v1 import trainer_pb2

pytestmark = pytest.mark.background  # losses, parameters and counts of waits

RANKS = 2
RANK = Path(__file__).with_name("megatron_rank.py")
DRAIN, BETWEEN = trainer_pb2.BUBBLE_KIND_DRAIN, trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS


def _need_megatron() -> None:
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        reason = "megatron-core is not installed (./dev.sh test installs megatron-core==0.16.1)"
        if os.environ.get("CI"):
            pytest.fail(reason + ": CI must run Megatron's real schedules")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def two_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    _need_megatron()
    a = Agents(tmp_path_factory.mktemp("agents"), ranks=RANKS).start()
    try:
        yield a
    finally:
        a.stop()


SCHEDULES = {"1f1b": "forward_backward_pipelining_without_interleaving",
             "interleaved": "forward_backward_pipelining_with_interleaving"}


@dataclasses.dataclass
class Trained:
    results: dict[str, list[dict[str, Any]]]  # per schedule, each rank's
    bubbles_seen: list[int]  # what each rank's agent counted meanwhile


@pytest.fixture(scope="module")
def trained(two_agents: Agents, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Both schedules, one after the other, in one launch of the ranks (Megatron imported once a rank)."""
    out = tmp_path_factory.mktemp("megatron")
    seen_before = [c.stats().gpu.bubbles for c in two_agents.clients]
    two_agents.launch(lambda rank: [sys.executable, str(RANK), ",".join(SCHEDULES),
                                    str(out / f"rank{rank}-{{schedule}}.json")], out, PYTHONWARNINGS="ignore")
    results = {s: [json.loads((out / f"rank{r}-{s}.json").read_text()) for r in range(RANKS)] for s in SCHEDULES}
    return Trained(results, [c.stats().gpu.bubbles - b for c, b in zip(two_agents.clients, seen_before, strict=True)])


def _waits(res: dict[str, Any]) -> list[list[int]]:
    return [b for b in res["instrumented"]["bubbles"] if b[2] != BETWEEN]


@pytest.mark.parametrize(("schedule", "function"), SCHEDULES.items())
def test_megatrons_real_schedule_reports_every_steps_waits_and_trains_the_same(
    schedule: str, function: str, trained: Trained
) -> None:
    results = trained.results[schedule]
    print(f"megatron-core {results[0]['megatron_core']}, CPU shims in {results[0]['shimmed']}")
    for r, res in enumerate(results):
        plain, inst = res["plain"], res["instrumented"]
        assert plain["function"] == inst["function"] == function
        assert plain["pipeline_rank"] == r
        # Training is bit-identical with and without freeride, and Megatron's own timers saw every call.
        assert (inst["losses"], inst["params_sha256"]) == (plain["losses"], plain["params_sha256"]), r
        assert inst["timer_calls"] == plain["timer_calls"] and inst["timers_restored"], r
        waits = _waits(res)
        for it, calls in enumerate(inst["timer_calls"]):
            started = Counter(name for name, what in calls if what == "start")
            receives = sum(n for name, n in started.items() if name in RECEIVING_TIMERS)
            sends = sum(n for name, n in started.items() if name in SENDING_TIMERS)
            assert receives > 0, (r, it, started)
            if schedule == "1f1b":  # (the interleaved schedule sends only with its combined calls, timed as receives)
                assert sends > 0, (r, it, started)  # the first stage's warm-up sends, the last stage's final send
            step = [b for b in waits if b[0] == it]
            # Every receive and, a CPU stage's sends blocking (gloo), every send is a timed wait
            assert len(step) == receives + sends, (r, it, started, step)
            assert sum(b[2] == DRAIN for b in step) == sends, (r, it, step)  # a send waits for the neighbour to take it
        assert sum(b[3] for b in waits) > 0, (r, waits)
    assert all(res["plain"]["losses"][-1] == [] for res in results[:-1])  # the losses come out of the last stage
    assert len(results[-1]["plain"]["losses"][-1]) == 4


def test_every_reported_wait_of_both_schedules_reached_its_ranks_agent(trained: Trained) -> None:
    reported = [sum(b[3] for results in trained.results.values() for b in _waits(results[r])) for r in range(RANKS)]
    assert trained.bubbles_seen == reported

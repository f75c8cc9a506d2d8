"""DeepSpeed's instrument() samples a quiet agent's steps by default (docs/benchmarks.md, "fourth pass"): the
integration test passes its own period, so only this one fails if the default changes."""

from __future__ import annotations

import inspect

from freeride.trainer import deepspeed
from freeride.trainer.waits import DEFAULT_QUIET_SAMPLE_MS


def test_a_quiet_agents_steps_are_sampled_every_half_second_by_default() -> None:
    assert DEFAULT_QUIET_SAMPLE_MS == 500.0
    assert inspect.signature(deepspeed.instrument).parameters["quiet_sample_ms"].default == DEFAULT_QUIET_SAMPLE_MS
    assert "(default 500)" in (deepspeed.instrument.__doc__ or "")

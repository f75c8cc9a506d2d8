"""Which DeepSpeed stages have their sends hooked: a gloo send blocks until the neighbour takes the data (idle
time, timed); an NCCL send is queued on the CUDA stream and returns at once (a hook would only cost: with
`stream` edges, two stream synchronisations a send)."""

from __future__ import annotations

import types

from freeride.trainer.deepspeed import sends_block


def test_a_cpu_stages_sends_are_timed_and_a_cuda_stages_are_not() -> None:
    assert sends_block(types.SimpleNamespace(type="cpu"))
    assert sends_block(None)  # an engine without a device attribute: DeepSpeed's CPU accelerator
    assert not sends_block(types.SimpleNamespace(type="cuda", index=0))

"""The bounds a submitted spec must keep, in-process: each refusal says what to change."""

from __future__ import annotations

import pytest

from freeride.agent.domain.model import TaskSpec
from freeride.agent.engine.validation import MIN_MEM_BYTES, check_spec
from freeride.errors import InvalidSpecError


@pytest.mark.parametrize("cap", [1, 4096, MIN_MEM_BYTES - 1])
def test_a_cap_below_what_a_bare_worker_holds_is_refused_at_submit(cap: int) -> None:
    with pytest.raises(InvalidSpecError) as err:
        check_spec(TaskSpec(name="t", ref="m:T", mem_limit_bytes=cap), None)
    assert str(err.value) == (f"memory cap of {cap} bytes is below 64 MiB, less than a bare worker (Python, gRPC "
                              "and freeride) holds; give --mem 64MiB or more, or leave it out")


@pytest.mark.parametrize("cap", [0, MIN_MEM_BYTES, 4 << 30])
def test_no_cap_and_caps_a_worker_can_live_in_are_accepted(cap: int) -> None:
    check_spec(TaskSpec(name="t", ref="m:T", mem_limit_bytes=cap), None)

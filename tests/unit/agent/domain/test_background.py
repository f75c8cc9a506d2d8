"""Specification of owned background tasks: kept until they end, waited for, their exceptions never lost."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.engine_fakes import in_loop

from freeride.agent.domain.background import Background


@in_loop
async def test_a_failing_task_is_logged_and_handed_to_whoever_acts_on_it(caplog: pytest.LogCaptureFixture) -> None:
    owner = Background("tests")
    seen: list[BaseException] = []

    async def breaks() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="freeride.agent"):
        owner.spawn(breaks(), on_error=seen.append)
        await owner.wait()
    assert [str(e) for e in seen] == ["boom"]
    assert "tests: " in caplog.text and "ValueError('boom')" in caplog.text
    assert len(owner) == 0


@in_loop
async def test_tasks_are_kept_until_they_end_and_can_be_cancelled_together() -> None:
    owner = Background("tests")
    release = asyncio.Event()
    done: list[str] = []

    async def finishes() -> None:
        await release.wait()
        done.append("finished")

    async def never() -> None:
        await asyncio.Event().wait()

    finishing = owner.spawn(finishes())
    forever = owner.spawn(never())
    assert len(owner) == 2
    release.set()
    await finishing
    assert done == ["finished"] and len(owner) == 1
    await owner.cancel()
    assert forever.cancelled() and len(owner) == 0

"""What a worker's crash makes of its task (freeride/agent/engine/crashes.py), as a table."""

from __future__ import annotations

from pathlib import Path

import pytest

from freeride.agent.domain.model import TaskState
from freeride.agent.engine.crashes import Verdict, after_crash

LOG = Path("/state/logs/task-1.log")


@pytest.mark.parametrize(("restarts", "retryable", "item", "verdict"), [
    (0, False, "", Verdict(TaskState.FAILED, "boom")),
    (0, True, "", Verdict(TaskState.STARTING, "restart 1/3 in 0.5s after: boom", 0.5, True)),
    (2, True, "", Verdict(TaskState.STARTING, "restart 3/3 in 2.0s after: boom", 2.0, True)),
    (3, True, "", Verdict(TaskState.FAILED, f"boom (gave up after 3 restarts; log: {LOG})")),
    (3, True, "inside pool item 1-7, its crash 2",  # a poison item's crash: no restart spent, even past the limit
     Verdict(TaskState.STARTING, "restart in 0.5s after: boom (inside pool item 1-7, its crash 2)", 0.5)),
])
def test_a_crash_is_restarted_with_backoff_until_the_limit_unless_a_pool_item_pays(
        restarts: int, retryable: bool, item: str, verdict: Verdict) -> None:
    assert after_crash(restarts, 3, 0.5, "boom", retryable, LOG, item) == verdict

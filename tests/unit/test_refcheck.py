"""The submit's reference check (freeride.agent.engine.refcheck) with a real check process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from freeride.agent.domain.model import TaskSpec
from freeride.agent.engine.refcheck import RefChecks
from freeride.errors import InvalidStateError

HANGS = '''
import os, time
with open(os.environ["FREERIDE_TEST_FIFO"], "w") as f:
    f.write("importing")
time.sleep(1000)
'''


def test_a_check_killed_by_the_agents_shutdown_is_refused_as_a_shutdown_not_as_the_tasks_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "hangs.py").write_text(HANGS)
    monkeypatch.setenv("FREERIDE_TEST_FIFO", str(fifo))

    async def main() -> None:
        checks = RefChecks(timeout_s=30)
        check = asyncio.ensure_future(checks.check(TaskSpec(name="hangs", ref=f"{tmp_path / 'hangs.py'}:Task")))
        assert await asyncio.to_thread(fifo.read_text) == "importing"  # the check is in the task's import
        checks.close()
        with pytest.raises(InvalidStateError, match="shutting down"):
            await asyncio.wait_for(check, 10)

    asyncio.run(main())

"""The submit's reference check (freeride.agent.engine.refcheck) with a real check process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from freeride.agent.config import MAX_CHECK_TIMEOUT_S
from freeride.agent.domain.model import TaskSpec
from freeride.agent.engine.refcheck import RefChecks, out_of_time
from freeride.errors import InvalidStateError, TaskRefError

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



def test_a_check_out_of_time_says_how_to_give_it_more_time_when_the_machine_is_only_busy(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(1000)\n")  # out of time however fast the machine

    async def main() -> str:
        with pytest.raises(TaskRefError) as err:
            await RefChecks(timeout_s=0.5).check(TaskSpec(name="slow", ref=f"{tmp_path / 'slow.py'}:Task"))
        return str(err.value)

    assert asyncio.run(main()) == (
        f"importing '{tmp_path / 'slow.py'}' did not finish in 0.5 s: keep slow work (sleeps, downloads, network "
        "calls) out of its import and its check_args; the check was stopped. If the machine is only busy, submit "
        "again, or start the agent with a longer --check-timeout-s (now 0.5, at most 40; or "
        "FREERIDE_CHECK_TIMEOUT_S)")
    # An agent already at the longest limit (the demo's) cannot be given more: only the retry is said.
    assert out_of_time("sidetasks.pagerank", MAX_CHECK_TIMEOUT_S).endswith(
        "the check was stopped. If the machine is only busy, submit again when it is less so")

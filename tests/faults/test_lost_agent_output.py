"""kill -9 of the agent takes its log writer (the reader of every worker's output pipe) with it: the worker's
final checkpoint must still run to the end, and what it prints must still reach the task's log."""

from __future__ import annotations

from pathlib import Path

from support.faults import assert_all_reaped, tagged_agent

from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2

TASK = '''
import os
import select
import time
from freeride import IterativeTask

class Chatty(IterativeTask):
    def __init__(self, marker: str, last: str, agent_pid: int) -> None:
        self.marker = marker
        self.last = last
        self.agent_pid = agent_pid
        self.n = 0
        self.calls = 0

    def step(self) -> None:
        self.n += 1
        time.sleep(0.001)

    def state_dict(self):
        self.calls += 1
        with open(self.last, "w") as f:  # which checkpoint came last
            f.write(str(self.calls))
        try:  # the one checkpoint (its interval is an hour) comes after the agent was killed: wait for its exit
            pidfd = os.pidfd_open(self.agent_pid)
        except ProcessLookupError:
            pass  # gone, and reaped already
        else:
            select.select([pidfd], [], [])  # readable once it exited: its end of our output pipe is closed too
            os.close(pidfd)
        print(f"{self.marker}: checkpoint {self.calls}", flush=True)
        return {"n": self.n}

    def load_state_dict(self, state) -> None:
        self.n = state["n"]
'''


def test_a_worker_that_lost_its_agent_checkpoints_and_its_output_reaches_the_log(tmp_path: Path) -> None:
    task_file = tmp_path / "chatty.py"
    task_file.write_text(TASK)
    marker = "lost-agent-marker"
    agent = tagged_agent(tmp_path / "state").start()
    try:
        with agent.client() as c:
            assert agent.proc is not None
            info = c.submit(S.TaskSpec(ref=f"{task_file}:Chatty", checkpoint_interval_s=3600,
                                       args={"marker": marker, "last": str(tmp_path / "last"),
                                             "agent_pid": str(agent.proc.pid)}))
            wait_for_task(c, info.id, [S.TASK_STATE_READY])
            log_path = Path(c.get(info.id).log_path)
        before = (tmp_path / "last").read_text() if (tmp_path / "last").exists() else "0"
    finally:
        agent.kill9()
    assert_all_reaped(agent.tag)  # the worker saw its stream break, checkpointed and exited
    final = (tmp_path / "last").read_text()  # the checkpoint taken after the agent died
    assert int(final) > int(before)
    text = log_path.read_text() if log_path.exists() else ""
    assert f"{marker}: checkpoint {final}\n" in text, text[-2000:]
    assert "BrokenPipeError" not in text and "state_dict() raised" not in text

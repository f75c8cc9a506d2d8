"""A task's end of life on a real agent: a slow checkpoint on cancel, a worker that lost its file descriptors."""

from __future__ import annotations

import pickle
from pathlib import Path

import psutil
from conftest import BackgroundTrainer
from fault_support import ref

from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2


def _stepped(task_id: str):  # type: ignore[no-untyped-def]
    return lambda windows: any(s.task_id == task_id and s.steps for w in windows for s in w.shares)


def test_a_task_cancelled_while_its_checkpoint_takes_seconds_ends_cancelled_with_the_checkpoint_written(
    agent: AgentProcess, client,  # type: ignore[no-untyped-def]
) -> None:
    # The hang timeout is 1 s (FAST): a checkpoint of 2.5 s outlasts it, as a 500 MB state_dict would.
    task = client.submit(S.TaskSpec(ref=ref("lifecycle", "SlowCheckpoint"), args={"checkpoint_s": "2.5"},
                                    checkpoint_interval_s=3600))
    ready = wait_for_task(client, task.id, [S.TASK_STATE_READY])
    with WindowCollector(client) as windows, BackgroundTrainer(agent, [20.0]):
        assert windows.wait_until(_stepped(task.id), 20)
        assert client.cancel(task.id).state == S.TASK_STATE_CANCELLED
        psutil.Process(ready.pid).wait(20)  # bubbles keep coming while it checkpoints
    info = client.get(task.id)
    assert info.state == S.TASK_STATE_CANCELLED and info.reason == "cancelled by user"
    assert info.counters.killed_steps == 0
    with open(Path(agent.state_dir) / "checkpoints" / f"task-{task.id}.ckpt", "rb") as f:
        assert pickle.load(f)["state"]["count"] > 0
    assert "killing" not in agent.log_path.read_text()


def test_a_task_that_closes_the_workers_file_descriptors_fails_with_that_cause_not_a_grpc_abort(
    agent: AgentProcess, client,  # type: ignore[no-untyped-def]
) -> None:
    task = client.submit(S.TaskSpec(ref=ref("lifecycle", "ClosesFds"), max_restarts=0))
    with BackgroundTrainer(agent, [20.0]):
        info = wait_for_task(client, task.id, [S.TASK_STATE_FAILED])
    assert "the worker's window pipe (fd " in info.reason
    assert "was closed: Bad file descriptor" in info.reason

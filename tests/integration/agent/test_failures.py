"""A failing side task never takes the agent down: it is restarted from its checkpoint or failed with a reason.

(A bad task refused at submit is checked in-process, against the real servicers:
tests/unit/agent/edge/test_servicers.py.)
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import psutil
from support.agents import BackgroundTrainer, spec

from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2

READY, FAILED = tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_FAILED


def test_a_crashed_worker_restarts_from_its_checkpoint(agent, client, tmp_path: Path):
    # 5 ms steps: the 30 before the crash span several of the agent's 50 ms checkpoint intervals (with 1 ms steps,
    # under three xdist workers, the crash once came before the first checkpoint)
    task = client.submit(spec("CrashOnce", marker=tmp_path / "crashed", at=30, step_ms=5, steps=60))
    wait_for_task(client, task.id, [READY])
    with BackgroundTrainer(agent, [20.0, 20.0]):
        # (60 s each: at twice the cores' load 30 s was not enough for the last 30 steps of 1 ms)
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_STARTING], timeout_s=60)  # crashed at step 30
        back = wait_for_task(client, task.id, [READY], timeout_s=60)
        done = wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_DONE], timeout_s=60)
    assert (tmp_path / "crashed").exists()
    assert back.restarts == 1 and done.restarts == 1
    assert "injected crash" in back.reason
    # It resumed from a checkpoint taken before the crash, not from zero, and counted on to the end.
    assert 0 < back.checkpoint_steps < 30
    assert done.progress["count"] == 60


def test_a_task_that_keeps_failing_is_failed_with_the_exception_as_reason(agent, client):
    task = client.submit(tasks_pb2.TaskSpec(ref=spec("AlwaysFails").ref, max_restarts=2))
    wait_for_task(client, task.id, [READY])
    with BackgroundTrainer(agent, [10.0]):
        info = wait_for_task(client, task.id, [FAILED], timeout_s=20)
    assert info.restarts == 2  # restarted twice, then given up: `restarts` counts restarts that happened
    assert "step() raised RuntimeError: boom" in info.reason
    assert "gave up after 2 restarts" in info.reason
    assert client.health() == 1  # SERVING: the agent is untouched


def test_sys_exit_and_abort_in_a_step_are_crashes_with_the_cause_recorded(agent, client):
    exits = client.submit(tasks_pb2.TaskSpec(ref=spec("Exits").ref, max_restarts=0))
    aborts = client.submit(tasks_pb2.TaskSpec(ref=spec("Aborts").ref, max_restarts=0))
    wait_for_task(client, exits.id, [READY])
    wait_for_task(client, aborts.id, [READY])
    with BackgroundTrainer(agent, [10.0, 10.0]):
        e = wait_for_task(client, exits.id, [FAILED], timeout_s=10)
        a = wait_for_task(client, aborts.id, [FAILED], timeout_s=10)
    assert "step() called sys.exit(3)" in e.reason
    assert "SIGABRT" in a.reason


def test_a_step_that_hangs_past_its_window_is_killed_counted_and_restarted(agent, client, tmp_path: Path):
    task = client.submit(spec("Hangs", marker=tmp_path / "hung", at=5))
    wait_for_task(client, task.id, [READY])
    first_pid = client.get(task.id).pid
    with BackgroundTrainer(agent, [20.0]):
        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_STARTING], timeout_s=15)  # killed, restarting
        info = wait_for_task(client, task.id, [READY], timeout_s=15)
    assert info.restarts == 1
    assert info.counters.killed_steps == 1
    assert "hung" in info.reason
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE


def test_a_checkpoint_in_another_format_fails_the_task_once_saying_what_to_do_and_is_kept(agent, client):
    # Written by a future freeride (format 99) before the task's first start: resuming from it would guess.
    ckpt = agent.state_dir / "checkpoints" / "task-1.ckpt"
    ckpt.write_bytes(pickle.dumps({"version": 99, "steps": 5, "state": {"count": 5}}))
    task = client.submit(spec("Counter", steps=10))
    assert task.id == "1"
    failed = wait_for_task(client, task.id, [FAILED])
    assert failed.restarts == 0  # not retried: a retry reads the same file
    assert "format 99" in failed.reason and "move the file away" in failed.reason
    assert pickle.loads(ckpt.read_bytes())["version"] == 99  # the user's file is untouched


def test_a_progress_over_what_a_message_carries_is_cut_to_its_first_keys_and_said_so(agent, client):
    """progress() returning ~5 MiB (over gRPC's 4 MiB) used to end the worker silently: 'exited with code 0'."""
    task = client.submit(spec("HugeProgress", keys=300_000, steps=40))
    with BackgroundTrainer(agent, [20.0]):
        done = wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_DONE, FAILED], timeout_s=60)
    assert done.state == tasks_pb2.TASK_STATE_DONE and done.restarts == 0, done.reason
    progress = dict(done.progress)
    # Kept: the first 64 numbers in the order progress() gave them (the string is not one); NaN as it is.
    assert progress.pop("progress_dropped") == 300_003 - 64
    assert math.isnan(progress.pop("loss")) and progress.pop("count") == 40
    assert sorted(progress) == [f"metric_{i:07d}" for i in range(62)]  # (a protobuf map keeps no order)
    log = Path(done.log_path).read_text()
    assert log.count("progress() returned 300003 entries, 299939 dropped (299938 past the first 64 kept, 1 whose "
                     "values are not numbers)") == 1, log[-2000:]  # once per worker, however often it is sampled

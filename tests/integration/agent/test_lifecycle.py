"""Pause, resume, cancel, and the agent's own restarts: no task and no harvested second is lost.

(That a cancel is final, and what later actions answer, is checked in-process: tests/unit/agent/edge/test_servicers.py.)
"""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
from support.agents import FAST, BackgroundTrainer, bubbles, drive, spec, wait_gone
from support.jitter import fail_unless_loaded_past_cores

from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_info, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2


def test_pause_checkpoints_and_frees_the_worker_then_resume_continues_from_there(agent, client):
    task = client.submit(spec("Counter", step_ms=1))
    ready = wait_for_task(client, task.id, [S.TASK_STATE_READY])
    drive(agent, bubbles(6, [20.0]))
    paused = client.pause(task.id)
    assert paused.state == S.TASK_STATE_PAUSED
    assert not wait_gone([ready.pid], 10)  # the worker exits: its memory is given back
    info = wait_for_info(client, task.id, lambda i: i.pid == 0)  # announced once the agent has reaped it
    assert info.checkpoint_steps == info.progress["count"] > 0
    client.resume(task.id)
    resumed = wait_for_task(client, task.id, [S.TASK_STATE_READY])
    drive(agent, bubbles(5, [20.0]))
    after = client.get(task.id)
    assert resumed.pid != ready.pid
    assert after.progress["count"] > info.progress["count"]  # counted on from the checkpoint
    assert after.counters.harvested_s > info.counters.harvested_s


def test_after_kill_9_every_task_comes_back_in_its_state_with_its_harvest(tmp_path: Path):
    state = tmp_path / "state"
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    with agent.client() as c:
        running = c.submit(spec("Counter", step_ms=1))
        paused = c.submit(spec("Counter", step_ms=1))
        done = c.submit(spec("Counter", step_ms=1, steps=10))
        for t in (running, paused, done):
            wait_for_task(c, t.id, [S.TASK_STATE_READY])
        with BackgroundTrainer(agent, [20.0, 20.0]):  # until it is done: a loaded machine fits fewer steps a bubble
            wait_for_task(c, done.id, [S.TASK_STATE_DONE])
        c.pause(paused.id)
        c.cancel(c.submit(spec("Counter")).id)
        with BackgroundTrainer(agent, [20.0]):
            before = {t.id: t for t in c.list()}
            gpu_before = c.stats().gpu
            old_pid = before[running.id].pid
            agent.kill9()  # in the middle of the trainer's bubbles
    assert not wait_gone([old_pid], 10)  # its worker noticed, checkpointed and left
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    try:
        with agent.client() as c:
            back = wait_for_task(c, running.id, [S.TASK_STATE_READY])
            after = {t.id: t for t in c.list()}
            assert after[paused.id].state == S.TASK_STATE_PAUSED
            assert after[done.id].state == S.TASK_STATE_DONE
            assert [t.state for t in after.values()].count(S.TASK_STATE_CANCELLED) == 1
            assert back.pid != old_pid and back.reason == "agent restarted"
            assert back.checkpoint_steps > 0
            for tid, t in before.items():  # harvested totals are never lost (only what was in flight)
                assert after[tid].counters.harvested_s >= t.counters.harvested_s * 0.9
                assert after[tid].counters.harvested_s > 0 or t.counters.harvested_s == 0
            # The GPU's books lose at most the windows in flight and those accounted in the store's last flush delay
            # (0.1 s: a few 20 ms bubbles, freeride/agent/state/store.py); at twice the cores' load 16 of 69 ms once.
            lost = gpu_before.harvested_s - c.stats().gpu.harvested_s
            if lost > max(0.1 * gpu_before.harvested_s, 0.06):
                fail_unless_loaded_past_cores(f"the GPU's harvest lost {lost * 1e3:.0f} of "
                                              f"{gpu_before.harvested_s * 1e3:.0f} ms at the kill")
            drive(agent, bubbles(5, [20.0]))
            assert c.get(running.id).progress["count"] > before[running.id].progress["count"] * 0.5
    finally:
        assert agent.stop() == 0


def test_sigterm_stops_in_order_and_the_next_agent_resumes_from_the_checkpoint(tmp_path: Path):
    state = tmp_path / "state"
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    with agent.client() as c:
        task = c.submit(spec("Counter", step_ms=1))
        pid = wait_for_task(c, task.id, [S.TASK_STATE_READY]).pid
        drive(agent, bubbles(6, [20.0]))
        count = c.get(task.id).progress["count"]
    assert agent.stop() == 0
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not agent.socket.exists()
    agent = AgentProcess(state_dir=state, extra_args=FAST).start()
    try:
        with agent.client() as c:
            info = wait_for_task(c, task.id, [S.TASK_STATE_READY])
            # The shutdown checkpoint holds every step that ran (progress, sampled at most once a second,
            # may have lagged behind when `count` was read).
            assert info.checkpoint_steps == info.counters.steps >= count > 0
    finally:
        assert agent.stop() == 0


# -- a task whose resource is down (its step raises Unavailable) ------------------------------------
def _waiting(info: tasks_pb2.TaskInfo) -> bool:
    return info.reason.startswith("waiting: ")


def test_a_task_whose_resource_is_down_waits_without_a_window_and_runs_to_done_once_it_is_back(
    agent, client, tmp_path: Path
):
    marker = tmp_path / "db-up"
    task = client.submit(spec("NeedsFile", marker=marker, steps=40))
    pid = wait_for_task(client, task.id, [S.TASK_STATE_READY]).pid
    with WindowCollector(client) as windows, BackgroundTrainer(agent, [20.0]) as trainer:
        waiting = wait_for_info(client, task.id, _waiting)  # its first step raised: announced to watchers
        assert waiting.reason == "waiting: db-up is missing"
        assert waiting.state == S.TASK_STATE_READY and waiting.counters.steps == 0
        before = client.stats().gpu  # its last window has an id up to this one
        # 60 bubbles go by (longer than the 1 s hang timeout) and no window is its: with no other task the agent
        # is quiet (it reads the ring late and grants nothing), yet it counts every bubble.
        assert trainer.wait_iterations(60, 30)
        assert client.stats().gpu.bubbles >= before.bubbles + 60
        later = [w for w in windows.windows if w.window_id > before.windows_granted]
        assert not [w.window_id for w in later if any(s.task_id == task.id for s in w.shares)]
        still = client.get(task.id)
        assert _waiting(still) and still.pid == pid and still.restarts == 0 and still.counters.killed_steps == 0
        marker.write_text("up")  # available() sees it at the next backoff (at most 0.2 s)
        done = wait_for_task(client, task.id, [S.TASK_STATE_DONE, S.TASK_STATE_FAILED])
    # The steps that raised were not steps: the worker counted 40 (its last checkpoint holds them all).
    assert done.state == S.TASK_STATE_DONE and done.progress["count"] == 40 and done.checkpoint_steps == 40
    assert not _waiting(done) and done.restarts == 0


def test_pause_resume_and_cancel_reach_a_waiting_task_at_once(agent, client, tmp_path: Path):
    task = client.submit(spec("NeedsFile", marker=tmp_path / "never", retry_s=600, max_retry_s=600))
    pid = wait_for_task(client, task.id, [S.TASK_STATE_READY]).pid
    with BackgroundTrainer(agent, [20.0]):
        wait_for_info(client, task.id, _waiting)
        assert client.pause(task.id).state == S.TASK_STATE_PAUSED
        assert not wait_gone([pid], 10)  # at once: not after its 600 s backoff
        client.resume(task.id)
        pid = wait_for_info(client, task.id, _waiting).pid  # the new worker's first step finds it down again
        assert client.cancel(task.id).state == S.TASK_STATE_CANCELLED
        assert not wait_gone([pid], 10)
    assert client.get(task.id).state == S.TASK_STATE_CANCELLED


def test_unavailable_raised_from_run_fails_the_task_and_says_where_it_belongs(agent, client):
    task = client.submit(spec("WaitsInRun"))
    with BackgroundTrainer(agent, [20.0]):
        failed = wait_for_task(client, task.id, [S.TASK_STATE_FAILED, S.TASK_STATE_DONE])
    assert failed.state == S.TASK_STATE_FAILED and failed.restarts == 0  # a mistake: not retried
    assert failed.reason.startswith("run() raised Unavailable (the database is down); "
                                    "Unavailable is for IterativeTask.step()")


_VERSIONED = '''
from freeride import IterativeTask

class Versioned(IterativeTask):
    def __init__(self) -> None:
        self.count = 0

    def step(self) -> None:
        self.count += 1

    def progress(self):
        return {"version": VERSION, "count": self.count}

VERSION = {version}
'''


def test_a_file_reference_is_pinned_to_its_real_path_at_submit_so_a_swapped_symlink_changes_nothing(
    agent, client, tmp_path: Path
):
    for version in (1, 2):
        (tmp_path / f"v{version}").mkdir()
        (tmp_path / f"v{version}" / "task.py").write_text(_VERSIONED.replace("{version}", str(version)))
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1")
    task = client.submit(S.TaskSpec(ref=f"{current}/task.py:Versioned"))
    assert task.spec.ref == f"{tmp_path / 'v1' / 'task.py'}:Versioned"  # resolved at submit: what was checked
    wait_for_task(client, task.id, [S.TASK_STATE_READY])
    with BackgroundTrainer(agent, [20.0]):  # bubbles until it stepped: a loaded machine may need many
        stepped = wait_for_info(client, task.id, lambda i: i.progress["count"] > 0, 60, at_windows=True)
        assert stepped.progress["version"] == 1

    current.unlink()
    current.symlink_to(tmp_path / "v2")  # the directory swapped under the submitted path
    client.pause(task.id)
    wait_for_info(client, task.id, lambda i: i.pid == 0)
    client.resume(task.id)  # a new worker loads the task again
    before = wait_for_task(client, task.id, [S.TASK_STATE_READY]).progress["count"]
    with BackgroundTrainer(agent, [20.0]):
        after = wait_for_info(client, task.id, lambda i: i.progress["count"] > before, 60, at_windows=True)
    assert after.progress["version"] == 1  # still the code that was checked, not v2's


def test_sighup_is_ignored_with_a_line_and_sigterm_still_stops_in_order(tmp_path: Path):
    """Round 3, item 4: one SIGHUP (a closed terminal) ended the agent at once: no line, no final write."""
    agent = AgentProcess(state_dir=tmp_path / "state", extra_args=FAST).start()
    try:
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGHUP)
        with agent.client() as c:
            c.wait_ready(10)  # (a SIGHUP not handled yet would still end it before the SIGTERM below: lower first)
    finally:
        code = agent.stop()
    log = agent.log_path.read_text()
    assert code == 0, agent.log_tail()
    assert "SIGHUP ignored" in log and "agent stopped" in log, agent.log_tail()

"""The agent or a trainer rank dies in the middle of a bubble.

- `kill -9` of the agent while a side-task step runs in a window: training goes on untouched,
  every worker checkpoints and exits, and the next agent on the same state directory brings every
  task back from its checkpoint with the durable ledger (a kill loses at most the last flush).
- A trainer rank killed or hung in a bubble (its END never comes): the window closes at once when
  the rank's stream drops, and by the predicted end (`until`) when the stream stays open.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.agents import BackgroundTrainer
from support.faults import (
    BeaconReader,
    Ledger,
    Training,
    assert_all_reaped,
    assert_no_tracebacks,
    assert_same_training,
    durable,
    node_agents,
    plain_run,
    ref,
    tagged_agent,
)

from freeride.tooling.harness import WindowCollector, wait_for_task, wait_for_trainers
from freeride.v1 import tasks_pb2

S = tasks_pb2
FLUSH_S = 0.1  # the agent flushes accounting to SQLite within this (core._COUNTER_FLUSH_S)
STEP_SLACK_NS = 50_000_000  # a 1 ms step begun before `until` ends within this, even on a loaded runner


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return plain_run(tmp_path_factory.getbasetemp() / "plain")


@pytest.mark.timeout(300)  # two trainings (one shared) and two agent starts on a loaded 2-core runner
def test_agent_kill_9_mid_bubble_then_restart_loses_no_task_and_no_durable_harvest(plain, tmp_path: Path) -> None:
    root = tmp_path / "sockets"
    first, neighbour = node_agents(root)
    beacon = BeaconReader(tmp_path / "beacon")
    second = None
    try:
        first.start()
        neighbour.start()
        with first.client() as c, neighbour.client() as n:
            n.submit(S.TaskSpec(ref=ref("behaviours", "Counter")))
            stepping = c.submit(S.TaskSpec(ref=ref("faulty", "Beacon"), args={"fifo": str(beacon.path)}))
            paused = c.submit(S.TaskSpec(ref=ref("behaviours", "Counter")))
            for t in (stepping, paused):
                wait_for_task(c, t.id, [S.TASK_STATE_READY])
            c.pause(paused.id)
            training = Training(root, tmp_path / "run")
            with BackgroundTrainer(first, [20.0], rank=7):
                # The first step... then one more: harvest is under way. A worker runs at nice 19: on a machine
                # loaded past its cores (the suite at twice its cores' load) one step may wait tens of seconds.
                beacon.next_step(60)
                beacon.next_step(60)
                before = c.stats()
                # Let several flush periods pass after `before` (a loaded runner's database writes lag), then kill
                # right after a step ended in an open window: mid-bubble.
                flushed_ns = time.monotonic_ns() + int(5 * FLUSH_S * 1e9)
                while beacon.next_step(60) < flushed_ns:
                    pass
                first.kill9()
        # Every worker of the dead agent saw its stream break, checkpointed and exited; nothing it forked lingers.
        assert_all_reaped(first.tag)
        ledger_before, tasks_s = durable(first.state_dir)
        gpu_s = ledger_before.harvested_ns / 1e9
        # The durable ledger trails the live one by at most the last flush (harvest accrues at most 1 s per s).
        assert before.gpu.harvested_s - 2 * FLUSH_S <= gpu_s
        for t in before.tasks:
            assert t.counters.harvested_s - 2 * FLUSH_S <= tasks_s[t.id]

        second = tagged_agent(first.state_dir)  # the same state dir, so the same socket
        second.start()
        ledger = Ledger()
        ledger.gpu_s.append(gpu_s)
        ledger.tasks_s = {k: [v] for k, v in tasks_s.items()}
        with second.client() as c:
            back = wait_for_task(c, stepping.id, [S.TASK_STATE_READY])
            assert back.reason == "agent restarted" and back.checkpoint_steps > 0
            after = ledger.sample(c)  # nothing that was durable is lost
            assert {t.id for t in after.tasks} == {t.id for t in before.tasks}
            assert {t.id: t.state for t in after.tasks}[paused.id] == S.TASK_STATE_PAUSED
            with WindowCollector(c) as windows:
                with BackgroundTrainer(second, [20.0], rank=7):
                    beacon.next_step(30)  # the task steps again, from its checkpoint
                    beacon.next_step(10)
                windows.wait_for_all(c)  # its step reports reached the agent (they precede each window's end)
            resumed = c.get(stepping.id)
            ledger.sample(c)
        assert resumed.progress["count"] > back.checkpoint_steps > 0
        assert ledger.gpu_s[-1] > ledger.gpu_s[0]
        assert_same_training(plain, training.results())  # training never noticed the agent's death
    finally:
        beacon.close()
        for agent in (second, neighbour, first):
            if agent is not None:
                assert agent.stop() in (0, -signal.SIGKILL), agent.log_tail()
                assert_all_reaped(agent.tag)
        for agent in (second, neighbour):
            if agent is not None:
                assert_no_tracebacks(agent)


# A synthetic rank in its own process: six iterations of a 300 ms bubble teach the agent the slot,
# then a seventh bubble starts and the rank dies or hangs in it (its END never comes). The bubble is long
# so that the kill (after the test saw a step in it) reaches the agent before the predicted end even on
# a loaded runner.
RANK = """
import sys, time
from freeride.tooling.trace import Segment
from freeride.tooling.harness import replay
from freeride.trainer.reporter import BubbleReporter
reporter = BubbleReporter(sys.argv[1], rank=3)
assert reporter.wait_connected(10)
replay(reporter, [[Segment(0.002, False), Segment(0.3, True, 0)]] * 6)
reporter.set_iteration(6)
reporter.start(0)
print(time.monotonic_ns(), flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_trainer_rank_dying_mid_bubble_closes_its_window_and_idles_the_workers(how: str, tmp_path: Path) -> None:
    agent = tagged_agent(tmp_path / "state").start()
    beacon = BeaconReader(tmp_path / "beacon")
    rank = None
    try:
        with agent.client() as c, WindowCollector(c) as windows:
            task = c.submit(S.TaskSpec(ref=ref("faulty", "Beacon"), args={"fifo": str(beacon.path)}))
            wait_for_task(c, task.id, [S.TASK_STATE_READY])
            rank = subprocess.Popen([sys.executable, "-c", RANK, agent.target], stdout=subprocess.PIPE, text=True)
            assert rank.stdout is not None
            started_ns = int(rank.stdout.readline())
            # Two steps ended after the last bubble's START: the rank is mid-bubble, and its window granted. (One may
            # be the window before's last step, running at that window's revoke and ending late on a loaded machine;
            # no second one starts before the next grant.)
            after_start = 0
            while after_start < 2:
                after_start += beacon.next_step(30) >= started_ns
            if how == "killed":
                rank.kill()
            else:
                rank.send_signal(signal.SIGSTOP)
                steps = beacon.until_quiet(0.5)  # the steps stop on their own...
                assert c.stats().gpu.trainers == 1  # ...while the rank's stream is still open
                rank.kill()
            gone_ns = time.monotonic_ns()
            rank.wait()
            assert windows.wait_until(lambda ws: any(w.iteration == 6 for w in ws), 30)
            w = next(w for w in windows.windows if w.iteration == 6)
            share = w.shares[0]
            assert share.task_id == task.id and share.steps > 0
            assert w.bubble_end_ns == w.bubble_start_ns + w.predicted_ns  # no END: accounted up to the prediction
            assert share.idle_ns <= w.until_ns + STEP_SLACK_NS  # the worker went idle by the predicted end
            if how == "killed":
                assert share.idle_ns < w.until_ns  # closed when the stream dropped, before the predicted end
            else:
                assert share.idle_ns < gone_ns and max(steps, default=0) <= w.until_ns + STEP_SLACK_NS
            # The agent noticed the stream dropped and announced it (hung: the window closed at its prediction,
            # before the kill).
            stats = wait_for_trainers(c, 0)
            assert stats.gpu.trainers == 0
            assert c.get(task.id).state == S.TASK_STATE_READY  # idle, holding no window
            with BackgroundTrainer(agent, [20.0]):  # and the next trainer is served as usual
                beacon.next_step(30)
    finally:
        if rank is not None and rank.poll() is None:
            rank.kill()
            rank.wait()
        beacon.close()
        assert agent.stop() == 0, agent.log_tail()
        assert_all_reaped(agent.tag)
        assert_no_tracebacks(agent)

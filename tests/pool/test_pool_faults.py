"""A pool drained by four agents loses no item, whatever the node throws at it.

Four agents on fake GPUs, a synthetic trainer each, FilePool on each, against a real redis-server
(append-only file, an fsync per write). Mid-run: two agents killed with SIGKILL and one worker of
a third, one of the killed agents started again on its state dir, Redis shut down and started again;
plus poison items. At the end every item is counted done once, with one output holding the right
bytes, or is in the dead letters with its error, and no process is left behind. A smaller test shows the pool
task waiting without windows while Redis is down.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from support.agents import FAST, BackgroundTrainer
from support.faults import TASKS, TaggedAgent, assert_all_reaped, assert_no_tracebacks, clean_agent, tagged_agent
from support.redis_server import RedisServer

from freeride.agent.control.reprobe import REPROBE_MAX_NS
from freeride.pool import Pool, parse_pool_url, range_items
from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
from freeride.tooling.poolrun import FAKE_GPU, PoolRun, worker_up
from freeride.v1 import tasks_pb2

S = tasks_pb2
FAULTY = TASKS / "faulty.py"
AGENTS = 4  # (eight until 2026-11-29: the same faults, half the processes on the suite's two cores)
ITEMS = 20_000
POISON = (7, 1_500, 3_003)  # first tried before the faults; their retries come last (a failed item goes to the back)
LEASE_S = 2.0  # a dead worker's items come back to the others within the test's time
MAX_TRIES = 3
WORK_US = 600.0  # per item, so that 20,000 items span the faults (~15 s of work on a 2-core VM) and no more
MAX_STEP_MS = 0.0  # PoolTask's own: its steps fit themselves to the window (min_step_s)
# 40 ms bubbles every 60 ms (the pool runs' default: 20 every 30): with three xdist workers on the 2-core runner a
# step of these workers took 26 ms (p95) and fit none of the 16 ms a 20 ms bubble leaves (2026-11-29, quiet CI).
BUBBLE_MS, PERIOD_MS = 40.0, 60.0
# A killed worker is back in 50 ms; a SIGKILL counts as one of the task's restarts.
ARGS = [*FAST, *FAKE_GPU, "--max-restarts", "10"]


def _redis_waiting(info: S.TaskInfo) -> bool:
    return info.reason.startswith("waiting: Redis at ")


class Tagged:
    """Makes the run's agents, each with a tag of its own, and remembers every one (those killed too)."""

    def __init__(self) -> None:
        self.made: list[TaggedAgent] = []

    def __call__(self, state_dir: Path, gpu: int) -> AgentProcess:
        agent = tagged_agent(state_dir, gpu, ARGS)
        self.made.append(agent)
        return agent


@pytest.mark.slow
# 27 s alone on the 2-core VM (37 s with eight agents); its own waits (each ended by an event) allow 5 min: at
# twice the cores' load it passed the suite's 120 s default.
@pytest.mark.timeout(420)
def test_killed_agents_a_killed_worker_and_a_redis_restart_lose_no_item(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    agents = Tagged()
    run = PoolRun(tmp_path, redis_server.url("faults"), AGENTS, work_us=WORK_US, max_step_ms=MAX_STEP_MS,
                  bubble_ms=BUBBLE_MS, period_ms=PERIOD_MS, make_agent=agents)
    marks = [("start", time.monotonic())]
    with run:
        assert run.create(ITEMS, POISON, lease_s=LEASE_S, max_tries=MAX_TRIES) == ITEMS
        run.start()
        marks.append((f"{AGENTS} agents up", time.monotonic()))
        run.wait_pool(lambda s: s.done >= ITEMS // 4, timeout_s=60)
        marks.append(("25% done", time.monotonic()))
        # A worker of agent 1 and agents 2 and 3, with SIGKILL; agent 2 starts again on its state dir.
        worker = run.wait_task(1, lambda t: t.pid != 0).pid
        os.kill(worker, signal.SIGKILL)
        run.kill9(2)
        run.kill9(3)
        run.restart(2)
        # restarted (killed inside an item, the death is the item's: fix 40; else it spends a restart)
        run.wait_task(1, lambda t: t.pid not in (0, worker) and worker_up(t), timeout_s=30)
        status = run.pool.status(dead_shown=0)
        marks.append((f"kills, restarts ({status.done} done)", time.monotonic()))
        assert status.pending > ITEMS // 4, f"the pool is nearly drained before Redis goes: {status}; raise WORK_US"
        # Redis goes away: every task waits, saying so, and resumes once it is back.
        redis_server.stop()
        for k in sorted(run.alive):
            # A task whose steps fit no bubble on a loaded machine hears of Redis at its next re-probe, which may be
            # the re-probes' longest spacing away (it backs off to REPROBE_MAX_NS), then a series of windows
            # (a timeout whose reason is steps that fit no bubble skips where the load is past the cores: conftest)
            run.wait_task(k, _redis_waiting, timeout_s=REPROBE_MAX_NS / 1e9 + 60)
        marks.append(("Redis down, all waiting", time.monotonic()))
        redis_server.start()
        for k in sorted(run.alive):
            run.wait_task(k, lambda t: not _redis_waiting(t), timeout_s=60)
        marks.append(("Redis back, all resumed", time.monotonic()))
        infos = run.wait_finished(timeout_s=90)
        marks.append(("all DONE", time.monotonic()))
    assert {k: S.TaskState.Name(i.state) for k, i in infos.items()} == {k: "TASK_STATE_DONE" for k in infos}
    assert sorted(run.exit_codes) == [0, 1, 2] and set(run.exit_codes.values()) == {0}  # agent 3 stays dead

    good = {str(i) for i in range(ITEMS)} - {str(i) for i in POISON}
    outputs = run.outputs()
    assert set(outputs) == good  # no item lost, no poison item written
    assert not [k for k, v in outputs.items() if v != k]  # each output holds its own id
    processed = run.journal()
    assert {str(i): processed[str(i)] for i in POISON} == {str(i): MAX_TRIES for i in POISON}
    status = run.pool.status(dead_shown=100)
    assert (status.total, status.done, status.failed) == (ITEMS, len(outputs), len(POISON))
    assert (status.in_flight, status.queued) == (0, 0)
    assert sorted((d.item.id, d.tries, d.error) for d in status.dead) == sorted(
        (str(i), MAX_TRIES, f"ValueError: item {i} is poison") for i in POISON)
    again_done = sum(n - 1 for n in processed.values() if n > 1) - len(POISON) * (MAX_TRIES - 1)
    print(f"{ITEMS} items, {again_done} processed more than once (taken over from a killed worker or after the "
          f"Redis restart); " + ", ".join(f"{label} {t - marks[0][1]:.1f}s" for label, t in marks[1:]))
    for agent in agents.made:  # the killed agents' workers stopped on their own; nothing else outlived its agent
        assert_all_reaped(agent.tag)
    for agent in agents.made:
        assert_no_tracebacks(agent)


def test_while_redis_is_down_the_pool_task_waits_without_a_window_and_resumes_after(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    agents = Tagged()
    run = PoolRun(tmp_path, redis_server.url("down"), 1, work_us=1000.0, max_step_ms=MAX_STEP_MS, make_agent=agents)
    with run:
        run.create(1_000)
        run.start()
        run.wait_pool(lambda s: s.done >= 100, timeout_s=30)
        with run.client(0) as client, WindowCollector(client) as windows:
            before = run.pool.status(dead_shown=0).done
            redis_server.stop()
            waiting = run.wait_task(0, _redis_waiting, timeout_s=30)
            assert "does not answer" in waiting.reason and waiting.state == S.TASK_STATE_READY  # holds no window
            before_bubbles = client.stats().gpu  # the task's last window has an id up to windows_granted
            # 40 more bubbles go by (over a second: the task's first retry is due after 1 s), counted by the agent
            # (with no task that could take a window it is quiet: it reads the ring late and grants nothing)...
            assert run.wait_bubbles(0, 40, 30)
            # The agent goes on counting them. (Not necessarily 40 more than at the Stats call above: the loop adds
            # its bubbles up ten at a time, after each chunk, so its "40 more" can be as few as 31 since that call.)
            assert client.stats().gpu.bubbles > before_bubbles.bubbles
            later = [w for w in windows.windows if w.window_id > before_bubbles.windows_granted]
            assert not [w.window_id for w in later if w.shares]  # ...and none is the task's
            still = client.get(run.task_ids[0])
            assert _redis_waiting(still) and still.pid == waiting.pid and still.restarts == 0
            redis_server.start()
            resumed = run.wait_task(0, lambda t: not _redis_waiting(t), timeout_s=30)
            assert resumed.state != S.TASK_STATE_FAILED and resumed.pid in (0, waiting.pid)
        [done] = run.wait_finished(timeout_s=60).values()
    assert done.state == S.TASK_STATE_DONE and done.restarts == 0 and before < 900
    status = run.pool.status()
    assert (status.done, status.failed, status.pending) == (1_000, 0, 0) and len(run.outputs()) == 1_000
    assert_all_reaped(agents.made[0].tag)
    assert_no_tracebacks(agents.made[0])


def test_an_item_that_segfaults_its_worker_becomes_a_dead_letter_and_the_task_goes_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Each death inside process() counts one try for that item alone: after max_tries (3) deaths it is a dead
    letter, and the restarted worker finishes the rest. The deaths are the items': two poison items (six deaths)
    spend none of the task's restarts (the agent's default, 3), so the task outlives them (round 3, item 1)."""
    url = redis_server.url("segv")
    with Pool(parse_pool_url(url)) as pool:
        pool.create(range_items(40), max_tries=MAX_TRIES)  # the default lease (30 s): no death is found by a lease
    out = tmp_path / "out"
    with clean_agent(tmp_path / "state") as agent, agent.client() as client:
        task = client.submit(S.TaskSpec(ref=f"{FAULTY}:SegfaultPool",
                                        args={"pool": url, "out_dir": str(out), "poison": "13,27"}))
        with BackgroundTrainer(agent, [50.0]):
            done = wait_for_task(client, task.id, [S.TASK_STATE_DONE, S.TASK_STATE_FAILED], timeout_s=90)
        assert done.state == S.TASK_STATE_DONE, (done.reason, agent.log_tail())
        assert done.restarts == 0  # every death was inside a poison item: charged to the item
        assert "inside pool item" in agent.log_tail(200)  # each restart says whose crash it was
    journal = Counter((out / "journal").read_text().split())
    assert journal["13"] == journal["27"] == MAX_TRIES
    good = {str(i) for i in range(40)} - {"13", "27"}
    assert {p.name for p in out.iterdir()} == good | {"journal"}  # one output per item, no temporary file left
    assert all((out / i).read_text() == i for i in good)
    with Pool(parse_pool_url(url)) as pool:
        status = pool.status()
    assert (status.total, status.done, status.failed, status.in_flight, status.queued) == (40, 38, 2, 0, 0)
    assert sorted((d.item.id, d.tries, d.error) for d in status.dead) == [
        (i, MAX_TRIES, "its worker died while processing it") for i in ("13", "27")]
    [consumer] = status.consumers
    assert (consumer.done, consumer.failed) == (38, 2 * MAX_TRIES)  # each item counted done once
    log_text = Path(done.log_path).read_text(errors="replace")  # the worker's log: what each restart found
    for i in ("13", "27"):
        assert f"item {i}: the worker before this one died while processing it (try 3 of 3); moved to the dead " \
               "letters" in log_text

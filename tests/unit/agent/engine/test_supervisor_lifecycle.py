"""Specification of a task's stop and its checkpoint: no window while it checkpoints, a deadline of its own,
and reasons and counts that say what happened (in-process, as tests/unit/agent/engine/test_supervisor.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from support.engine_fakes import MiB, Rig, in_loop
from test_supervisor import STOPS, attach, bubble, grants, ready_task

from freeride.agent.domain.events import Checkpointing, Control, Failed, Ready, WindowDone
from freeride.agent.domain.model import TaskState


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


# -- bug 3: a checkpoint asked for by pause, cancel or shutdown is no step -------------------------


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_task_asked_to_stop_gives_back_its_window_and_gets_no_new_one_while_it_checkpoints(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    bubble(rig, 0)
    assert grants(worker) == [1]
    rig.ask_stop(rec, desired)
    rig.streams.on_worker_message(rec.id, worker.instance, WindowDone(1, idle_since_ns=5, step_estimate_ns=0))
    for it in (1, 2, 3):  # bubbles go on while state_dict() runs: none is granted to it (no hang timer either)
        bubble(rig, it)
    assert grants(worker) == [1]
    assert rig.scheduler.tasks[rec.id].hang_timer is None
    worker.exit(0)
    assert rec.state is desired and worker.kills == []


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_checkpoint_that_outlasts_the_checkpoint_timeout_is_killed_and_the_reason_says_so(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    rig.ask_stop(rec, desired)
    (deadline,) = rig.timers.pending()
    assert deadline.at - rig.timers.now == rig.config.checkpoint_timeout_s == 300.0  # the default: generous
    rig.timers.fire_next()
    verb = "pause" if desired is TaskState.PAUSED else "cancel"
    why = (f"its checkpoint after {verb} did not finish within 300s (--checkpoint-timeout-s); "
           "its worker was killed, its previous checkpoint is kept")
    assert worker.kills == [why]
    worker.exit(-9)
    assert (rec.state, rec.reason) == (desired, f"{desired.value.lower()} by user; {why}")


@in_loop
async def test_a_worker_that_stops_in_time_leaves_no_deadline_behind(rig: Rig) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    rig.ask_stop(rec, TaskState.CANCELLED)
    (deadline,) = rig.timers.pending()
    worker.exit(0)
    assert deadline.cancelled and rec.reason == "cancelled by user"


@in_loop
async def test_on_shutdown_the_shorter_of_grace_and_checkpoint_timeout_applies(tmp_path: Path) -> None:
    rig = Rig(tmp_path, checkpoint_timeout_s=0.01, shutdown_grace_s=60.0)
    rec, worker = await ready_task(rig)
    outbox = attach(rig, rec.id, worker.instance)
    stopping = asyncio.ensure_future(rig.sup.shutdown())
    await asyncio.wait_for(worker.killed.wait(), 5)  # 0.01 s, not 60 s
    assert outbox.get_nowait() is Control.PAUSE
    assert worker.kills == ["its checkpoint did not finish within the shutdown grace period (0.01s)"]
    worker.exit(-9)
    await stopping


@in_loop
async def test_a_worker_that_becomes_ready_while_the_agent_shuts_down_gets_no_window(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    attach(rig, rec.id, worker.instance)
    stopping = asyncio.ensure_future(rig.sup.shutdown())
    await asyncio.sleep(0)  # shutdown has begun (it waits for the exit)
    rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
    bubble(rig, 0)
    assert grants(worker) == [] and rec.id not in rig.scheduler.tasks
    worker.exit(0)
    await stopping


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_checkpoint_that_fails_on_pause_or_cancel_is_named_in_the_reason(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    rig.ask_stop(rec, desired)
    rig.streams.on_worker_message(rec.id, worker.instance, Failed("state_dict() raised OSError: disk full", True))
    worker.exit(1)
    assert rec.state is desired  # no crash, no restart
    why = "its checkpoint failed: state_dict() raised OSError: disk full"
    assert rec.reason == f"{desired.value.lower()} by user; {why}"


# -- round 2, item 1: a checkpoint nobody stopped the task for is no step either ---------------------


def _done(rig: Rig, rec_id: str, instance: int, window_id: int) -> None:
    rig.streams.on_worker_message(rec_id, instance, WindowDone(window_id, idle_since_ns=5, step_estimate_ns=0))


@in_loop
async def test_a_periodic_checkpoint_gets_no_window_and_no_hang_timer_but_a_deadline_of_its_own(rig: Rig) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    bubble(rig, 0)
    _done(rig, rec.id, worker.instance, 1)
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(True))  # its interval came due
    for it in (1, 2, 3):  # bubbles go on while a 2 GiB state_dict() runs
        bubble(rig, it)
    assert grants(worker) == [1] and rig.scheduler.tasks[rec.id].hang_timer is None
    (deadline,) = rig.timers.pending()
    assert deadline.at - rig.timers.now == rig.config.checkpoint_timeout_s  # not the hang timeout
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(False))
    assert deadline.cancelled and grants(worker) == [1, 4]  # the open window is its own again at once
    assert worker.kills == [] and rec.state is TaskState.READY


@in_loop
async def test_a_window_granted_just_before_a_periodic_checkpoint_began_arms_no_hang_timer_until_it_ends(
    rig: Rig,
) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    bubble(rig, 0)
    _done(rig, rec.id, worker.instance, 1)
    bubble(rig, 1)  # granted while the worker, idle, was about to checkpoint: it will not look before the end
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(True))
    bubble(rig, 2)  # that window closes unanswered: no hang timer, and no new grant
    slot = rig.scheduler.tasks[rec.id]
    assert grants(worker) == [1, 2] and slot.hang_timer is None
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(False))
    assert slot.hang_timer is not None  # from now on it answers as any idle worker does
    _done(rig, rec.id, worker.instance, 2)
    assert slot.hang_timer is None and grants(worker) == [1, 2, 3] and worker.kills == []


@in_loop
async def test_a_periodic_checkpoint_past_the_checkpoint_timeout_is_killed_and_restarted_saying_so(rig: Rig) -> None:
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(True))
    rig.timers.fire_next()
    why = ("its checkpoint did not finish within 300s (--checkpoint-timeout-s); "
           "its worker was killed, its previous checkpoint is kept")
    assert worker.kills == [why]
    worker.exit(-9)
    assert rec.state is TaskState.STARTING and rec.reason.endswith(f"after: {why}")


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_stop_during_a_periodic_checkpoint_waits_for_it_under_the_stops_deadline(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec, worker = await ready_task(rig)
    outbox = attach(rig, rec.id, worker.instance)
    bubble(rig, 0)
    _done(rig, rec.id, worker.instance, 1)
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(True))
    (periodic,) = rig.timers.pending()
    rig.timers.now = 200.0  # the checkpoint has run 200 s when the stop arrives
    rig.ask_stop(rec, desired)
    assert outbox.get_nowait() is control  # the worker takes it once its checkpoint is written
    (stop_deadline,) = rig.timers.pending()
    assert periodic.cancelled and stop_deadline.at == 500.0  # a full --checkpoint-timeout-s from the stop
    rig.streams.on_worker_message(rec.id, worker.instance, Checkpointing(False))
    bubble(rig, 1)
    assert grants(worker) == [1]  # stopping: no window after its checkpoint either
    worker.exit(0)
    assert (rec.state, rec.reason, worker.kills) == (desired, f"{desired.value.lower()} by user", [])


# -- bug 6: counts that agree ----------------------------------------------------------------------


@in_loop
async def test_a_task_never_counts_fewer_steps_than_the_checkpoint_it_resumes_from(rig: Rig) -> None:
    rec = rig.task()
    rec.counters.steps = 10  # the ledger as written before a kill -9 of the agent; the worker's checkpoint: 25
    await rig.sup.start(rec)
    rig.streams.on_worker_message(rec.id, rig.worker(rec).instance, Ready("iterative", 25, {}))
    assert (rec.checkpoint_steps, rec.counters.steps) == (25, 25)
    rig.worker(rec).exit(-9)  # its own kill -9: the new worker resumes from an older checkpoint
    rig.timers.fire_next()
    await rig.sup.settle()
    rig.streams.on_worker_message(rec.id, rig.worker(rec).instance, Ready("iterative", 20, {}))
    assert (rec.checkpoint_steps, rec.counters.steps) == (20, 25)  # steps run are never taken back


@in_loop
async def test_restarts_and_the_gave_up_count_agree_whatever_ended_each_worker(tmp_path: Path) -> None:
    rig = Rig(tmp_path, memory_cap_restarts=5)
    rec = rig.task(cap_bytes=10 * MiB)
    await rig.sup.start(rec)
    ends = ["hang", "memory", "crash", "spawn fails", "crash"]  # the 5th ends it: max_restarts is 3
    for n, end in enumerate(ends):
        if end == "spawn fails":
            rig.launcher.fail = OSError("fork failed")
        else:
            worker = rig.worker(rec)
            if end == "hang":
                rig.sup.hang(rec.id, window_id=1)
            elif end == "memory":
                rig.probe.bytes[worker.pid] = 11 * MiB
                await rig.watchdog.check()
            worker.exit(-9 if end in ("hang", "memory") else 1)
        if n < 3:
            restart = rig.timers.timers[-1]  # the backoff just set (the watchdog's next check is not due)
            restart.fired = True
            restart.fn()
            await rig.sup.settle()
    assert rec.state is TaskState.FAILED
    gave_up = re.search(r"gave up after (\d+) restarts", rec.reason)
    assert gave_up is not None and int(gave_up[1]) == rec.restarts == 3


@in_loop
async def test_a_pause_turned_cancel_while_it_checkpoints_is_killed_as_a_cancel(rig: Rig) -> None:
    """The deadline runs from the first stop; when it fires the reason names the stop asked for last."""
    rec, worker = await ready_task(rig)
    attach(rig, rec.id, worker.instance)
    rig.ask_stop(rec, TaskState.PAUSED)
    rig.ask_stop(rec, TaskState.CANCELLED)
    assert len(rig.timers.pending()) == 1  # one deadline: the cancel does not extend the pause's
    rig.timers.fire_next()
    why = ("its checkpoint after cancel did not finish within 300s (--checkpoint-timeout-s); "
           "its worker was killed, its previous checkpoint is kept")
    assert worker.kills == [why]
    worker.exit(-9)
    assert (rec.state, rec.reason) == (TaskState.CANCELLED, f"cancelled by user; {why}")

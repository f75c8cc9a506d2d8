"""Specification of the supervisor: start, crash and restart with backoff, give up, stop, memory admission,
and the memory watchdog's cap rule.

In-process with a fake launcher (workers exit when the test says so), a fake memory probe and
manual timers: backoff delays are read off the timers the supervisor sets, never waited for.
"""

from __future__ import annotations

import asyncio
import errno
import re
from pathlib import Path

import pytest
from support.engine_fakes import FakeWorker, MiB, Rig, in_loop

from freeride.agent.domain.events import Control, Edge, Ready, Steps, Waiting, WindowDone
from freeride.agent.domain.model import TaskRecord, TaskState
from freeride.agent.engine.tasks import Change


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


# -- start -----------------------------------------------------------------------------------------


@in_loop
async def test_a_started_task_has_one_worker_and_becomes_ready_when_the_worker_says_so(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    assert rec.state is TaskState.STARTING
    (worker,) = rig.launcher.workers
    assert rig.table.worker(rec.id) is worker
    await rig.sup.start(rec)  # a second start of a live task starts nothing
    assert len(rig.launcher.workers) == 1
    rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
    assert rec.state is TaskState.READY
    assert rec.id in rig.scheduler.tasks
    worker.exit(1)
    assert rec.id not in rig.scheduler.tasks and rig.table.live == {}  # nothing of the dead worker is left


@in_loop
async def test_a_tasks_peak_is_the_watchdogs_measure_never_the_workers_own_resident_set(rig: Rig) -> None:
    """The peak shown beside a cap is the figure the watchdog compares to it. The worker's own peak resident set
    (VmHWM) counts shared libraries whole: an Evaluate task showed `peak memory 417.5 MiB` over its 400 MiB cap
    with no kill (the watchdog's PSS never passed it); on a GPU the first run showed a CPU-only task's ~600 MiB of
    CUDA libraries over its 256 MiB device cap."""
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
    rig.streams.on_worker_message(rec.id, worker.instance, Steps(0, [], {}, 600 * MiB))  # CPU mode (the rig's)
    assert rec.peak_memory_bytes == 0


@in_loop
async def test_a_message_from_a_stale_worker_instance_is_ignored(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    rig.streams.on_worker_message(rec.id, rig.worker(rec).instance + 1, Ready("iterative", 0, {}))
    assert rec.state is TaskState.STARTING


# -- crash, restart, give up -----------------------------------------------------------------------


@in_loop
async def test_a_crashing_worker_is_restarted_after_1_2_4_s_then_failed_with_the_restarts_it_had(rig: Rig) -> None:
    rec = rig.task()  # the agent's --max-restarts: 3
    await rig.sup.start(rec)
    delays = []
    for n in (1, 2, 3):
        rig.worker(rec).exit(1)
        assert rec.state is TaskState.STARTING
        assert rec.restarts == n
        assert rec.reason.startswith(f"restart {n}/3 in ")
        assert "worker exited with code 1" in rec.reason
        (timer,) = rig.timers.pending()
        delays.append(timer.at - rig.timers.now)
        assert rig.table.worker(rec.id) is None  # nothing runs during the backoff
        rig.timers.fire_next()
        await rig.sup.settle()
        assert len(rig.launcher.of(rec.id)) == n + 1
    assert delays == [1.0, 2.0, 4.0]
    rig.worker(rec).exit(1)
    assert rec.state is TaskState.FAILED
    assert rig.timers.pending() == []
    gave_up = re.search(r"gave up after (\d+) restarts", rec.reason)
    assert gave_up is not None and int(gave_up[1]) == rec.restarts == 3
    assert rig.table.live == {}


@in_loop
async def test_a_failure_the_worker_calls_final_is_not_retried(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    worker.failure, worker.retryable = "the task's file is gone", False
    worker.exit(1)
    assert (rec.state, rec.reason, rec.restarts) == (TaskState.FAILED, "the task's file is gone", 0)


@in_loop
async def test_a_spawn_that_raises_is_a_crash_restarted_with_backoff_and_the_reason_says_why(rig: Rig) -> None:
    rec = rig.task(cap_bytes=64 * MiB)
    rig.launcher.fail = OSError(errno.EMFILE, "Too many open files")
    await rig.sup.start(rec)  # no exception escapes, and the task is not left STARTING for good
    assert rec.state is TaskState.STARTING
    assert rec.restarts == 1
    assert "could not start its worker" in rec.reason and "Too many open files" in rec.reason
    assert rig.table.live == {}  # its reservation went with the failed start
    (timer,) = rig.timers.pending()
    assert timer.at == 1.0
    rig.timers.fire_next()
    await rig.sup.settle()
    assert rig.worker(rec).task_id == rec.id  # the retry started it


@in_loop
async def test_a_spawn_that_keeps_raising_ends_failed_after_the_tasks_restarts(rig: Rig) -> None:
    rec = rig.task(max_restarts=0)
    rig.launcher.fail = RuntimeError("spawn broke")
    await rig.sup.start(rec)
    assert rec.state is TaskState.FAILED
    assert "could not start its worker: spawn broke" in rec.reason and "gave up after 0 restarts" in rec.reason


@in_loop
async def test_a_start_that_breaks_before_the_spawn_is_a_crash_too(rig: Rig) -> None:
    def gpu_query_breaks(*_: object) -> int:
        raise RuntimeError("NVML went away")

    rig.memory.usable_bytes = gpu_query_breaks  # type: ignore[method-assign]
    rec = rig.task(cap_bytes=64 * MiB)  # a capped task: admission asks the GPU
    await rig.sup.start(rec)
    assert rec.state is TaskState.STARTING and "could not start its worker: NVML went away" in rec.reason
    assert rig.launcher.workers == [] and rig.table.live == {}
    assert len(rig.timers.pending()) == 1  # restarted with backoff


# -- a full disk -----------------------------------------------------------------------------------
DISK_FULL = OSError(errno.ENOSPC, "No space left on device")


@in_loop
async def test_a_spawn_on_a_full_disk_waits_with_a_reason_and_backoff_and_is_charged_no_restart(rig: Rig) -> None:
    rec = rig.task(cap_bytes=64 * MiB, max_restarts=0)  # one crash would make it FAILED
    reasons: list[str] = []  # every reason written, in order
    on_change = rig.table._on_change
    rig.table._on_change = lambda r, change: (reasons.append(r.reason), on_change(r, change))  # type: ignore[method-assign]
    delays = []
    for _ in range(8):
        rig.launcher.fail = DISK_FULL
        if rec.state is TaskState.SUBMITTED:
            await rig.sup.start(rec)
        else:
            before = rig.timers.now
            rig.timers.fire_next()
            await rig.sup.settle()
            delays.append(rig.timers.now - before)
        assert (rec.state, rec.restarts) == (TaskState.STARTING, 0)
        assert rec.reason.startswith("waiting: disk full: its worker's files cannot be created in ")
        assert all(r.startswith("waiting: disk full") for r in reasons[1:])  # each try keeps it: no flicker
        assert "No space left on device" in rec.reason and rig.table.live == {}  # no reservation held meanwhile
    assert delays == [1, 2, 4, 8, 16, 30, 30]  # doubled, at most 30 s: a timer, not a busy retry
    rig.timers.fire_next()  # the disk has room again
    await rig.sup.settle()
    worker = rig.worker(rec)
    rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
    assert (rec.state, rec.restarts, rec.reason) == (TaskState.READY, 0, "started after the disk was full")


@in_loop
async def test_space_freed_starts_what_waits_for_the_disk_at_once_and_asks_a_waiting_worker_to_checkpoint(
    rig: Rig,
) -> None:
    starting = rig.task()
    rig.launcher.fail = DISK_FULL
    await rig.sup.start(starting)
    ckpt, ckpt_worker = await ready_task(rig)
    ckpt_out = attach(rig, ckpt.id, ckpt_worker.instance)
    rig.streams.on_worker_message(ckpt.id, ckpt_worker.instance, Waiting(
        "disk full: its checkpoint cannot be written to /s/checkpoints (No space left on device); free space", True))
    assert ckpt.reason.startswith("waiting: disk full: its checkpoint") and ckpt.id not in rig.scheduler.tasks
    redis, redis_worker = await ready_task(rig)
    redis_out = attach(rig, redis.id, redis_worker.instance)
    rig.streams.on_worker_message(redis.id, redis_worker.instance, Waiting("redis at db:6379 does not answer", True))

    rig.sup.disk_freed()  # freeride rm / prune / retention removed files
    await rig.sup.settle()
    assert rig.worker(starting).task_id == starting.id and starting.restarts == 0  # started now, not at its timer
    assert [t for t in rig.timers.pending() if t.at == 1.0] == []  # its backoff timer is gone
    assert ckpt_out.get_nowait() is Control.CHECKPOINT  # tries its checkpoint now
    assert redis_out.empty()  # waits for something else: not disturbed
    rig.streams.on_worker_message(ckpt.id, ckpt_worker.instance, Waiting("disk full: …", False))
    assert ckpt.reason == "" and ckpt.id in rig.scheduler.tasks  # written: it is scheduled again


@in_loop
async def test_space_freed_by_something_else_wakes_what_waits_for_the_disk_within_a_watchdog_tick(
    tmp_path: Path,
) -> None:
    """Nothing announces space freed outside freeride: while a task waits for the disk, the watchdog's tick
    reads the free space, and a real gain starts the task then, not at its backoff timer (8 s by its 4th try)."""
    free = [0]
    rig = Rig(tmp_path, free_bytes=lambda: free[0])
    rec = rig.task()
    rig.launcher.fail = DISK_FULL
    await rig.sup.start(rec)
    for _ in range(3):
        rig.launcher.fail = DISK_FULL
        rig.timers.fire_next()
        await rig.sup.settle()
    assert rec.reason.startswith("waiting: disk full") and [t.at for t in rig.timers.pending()] == [15.0]
    await rig.watchdog.check()  # the least free space in the wait
    free[0] = 512 << 10  # a log line or a temporary file: noise, nothing retried
    await rig.watchdog.check()
    await rig.sup.settle()
    assert rig.table.worker(rec.id) is None and rig.launcher.workers == []
    free[0] = 64 << 20  # another job's files removed
    await rig.watchdog.check()
    await rig.sup.settle()
    assert rig.worker(rec).task_id == rec.id and rig.timers.now == 7.0  # started now, its 8 s timer gone
    assert [t for t in rig.timers.pending() if t.at == 15.0] == []


# -- stop ------------------------------------------------------------------------------------------
STOPS = [(TaskState.PAUSED, Control.PAUSE), (TaskState.CANCELLED, Control.CANCEL)]  # a stop, the control it sends


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_stop_asks_an_attached_worker_for_the_matching_control(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    outbox = attach(rig, rec.id, worker.instance)
    rig.ask_stop(rec, desired)
    assert outbox.get_nowait() is control
    assert worker.kills == []  # it checkpoints and exits by itself
    worker.exit(0)
    assert rec.state is desired  # not restarted, not failed
    assert rig.timers.pending() == [] and rig.table.live == {}


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_worker_stopped_before_it_attached_is_killed_and_told_the_matching_control_if_it_attaches(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    rig.ask_stop(rec, desired)
    assert worker.kills == [f"{desired.value.lower()} before it attached"]
    outbox = attach(rig, rec.id, worker.instance)  # it attached while its kill was on its way
    assert outbox.get_nowait() is control


@in_loop
async def test_a_task_paused_while_its_worker_is_being_created_stops_that_worker(rig: Rig) -> None:
    rec = rig.task()
    rig.launcher.gate = asyncio.Event()
    start = asyncio.ensure_future(rig.sup.start(rec))
    await rig.launcher.spawning.wait()
    rig.ask_stop(rec, TaskState.PAUSED)
    rig.launcher.gate.set()
    await start
    (worker,) = rig.launcher.workers
    assert worker.kills == ["paused before it attached"]
    worker.exit(-9)
    assert rec.state is TaskState.PAUSED and rig.table.live == {}
    assert rig.changes[-1] == (rec.id, TaskState.PAUSED, Change.WORKER)  # watchers see its pid go


@in_loop
async def test_a_cancelled_tasks_worker_exit_is_announced_without_a_new_state(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    rig.ask_stop(rec, TaskState.CANCELLED)
    before = len(rig.changes)
    rig.worker(rec).exit(0)
    assert rig.changes[before:] == [(rec.id, TaskState.CANCELLED, Change.WORKER)]


@in_loop
async def test_a_pause_during_the_restart_backoff_cancels_the_restart(rig: Rig) -> None:
    rec = rig.task()
    await rig.sup.start(rec)
    rig.worker(rec).exit(1)
    (timer,) = rig.timers.pending()
    rig.ask_stop(rec, TaskState.PAUSED)
    assert timer.cancelled


# -- memory admission ------------------------------------------------------------------------------


@in_loop
async def test_a_task_that_does_not_fit_waits_visibly_and_starts_when_memory_frees(rig: Rig) -> None:
    rig.scheduler.trainer_free_memory_bytes = 1024 * MiB  # the trainer leaves 1 GiB (headroom 0)
    big, small = rig.task(cap_bytes=768 * MiB), rig.task(cap_bytes=512 * MiB)
    await rig.sup.start(big)
    await rig.sup.start(small)
    assert small.state is TaskState.SUBMITTED
    assert small.reason == "waiting for memory: needs 512 MiB, 256 MiB free for side tasks"
    assert rig.launcher.of(small.id) == []  # never started to fail
    assert rig.table.waiting() == [small] and rig.table.reserved_bytes == 768 * MiB

    rig.ask_stop(big, TaskState.CANCELLED)
    rig.launcher.of(big.id)[0].exit(-9)  # its worker is gone: its 768 MiB are free
    rig.timers.fire_next()  # the admission pass set for after the exit
    await rig.sup.settle()
    assert small.state is TaskState.STARTING
    assert len(rig.launcher.of(small.id)) == 1
    assert rig.table.waiting() == [] and rig.table.reserved_bytes == 512 * MiB


@in_loop
async def test_waiting_tasks_are_admitted_highest_priority_first(rig: Rig) -> None:
    rig.scheduler.trainer_free_memory_bytes = 100 * MiB
    low, high = rig.task(cap_bytes=300 * MiB, priority=1), rig.task(cap_bytes=300 * MiB, priority=9)
    await rig.sup.start(low)
    await rig.sup.start(high)
    assert rig.launcher.workers == []
    rig.scheduler.trainer_free_memory_bytes = 400 * MiB  # room for one of them
    rig.sup.admit_waiting()
    await rig.sup.settle()
    assert [w.task_id for w in rig.launcher.workers] == [high.id]
    assert rig.table.waiting() == [low]


@in_loop
async def test_an_uncapped_task_never_waits_for_memory(rig: Rig) -> None:
    rig.scheduler.trainer_free_memory_bytes = 1  # next to nothing left
    rec = rig.task()
    await rig.sup.start(rec)
    assert rig.launcher.of(rec.id) and rig.table.live[rec.id].reserved_bytes == 0


# -- the memory watchdog ---------------------------------------------------------------------------


@pytest.mark.parametrize(("used", "stopped"), [(200 * MiB + 1, True), (200 * MiB, False)])
@in_loop
async def test_the_watchdog_stops_a_worker_above_its_cap_and_only_above_it(rig: Rig, used: int, stopped: bool) -> None:
    rec = rig.task(cap_bytes=200 * MiB)
    calm = rig.task(cap_bytes=200 * MiB)
    await rig.sup.start(rec)
    await rig.sup.start(calm)
    rig.sup.watch_memory()
    rig.probe.bytes[rig.worker(rec).pid] = used
    rig.probe.bytes[rig.worker(calm).pid] = 100 * MiB
    rig.timers.fire_next()  # one watchdog sample
    await rig.watchdog.watched()
    kills = rig.worker(rec).kills
    if stopped:
        assert len(kills) == 1 and kills[0].startswith("memory_cap_exceeded: ")
        assert "cap 200 MiB" in kills[0]
    else:
        assert kills == []
    assert rig.worker(calm).kills == []  # another task is never touched
    assert rig.table.live[rec.id].memory_bytes == used and rec.peak_memory_bytes == used
    assert [t.at for t in rig.timers.pending()] == [2 * rig.config.memory_check_s]  # and it keeps watching


@pytest.mark.parametrize(("allowed", "state", "restarts"), [(0, TaskState.FAILED, 0), (1, TaskState.STARTING, 1)])
@in_loop
async def test_a_task_stopped_at_its_cap_is_restarted_only_as_often_as_memory_cap_restarts_allow(
    tmp_path: Path, allowed: int, state: TaskState, restarts: int
) -> None:
    rig = Rig(tmp_path, memory_cap_restarts=allowed)
    rec = rig.task(cap_bytes=10 * MiB)
    await rig.sup.start(rec)
    rig.probe.bytes[rig.worker(rec).pid] = 11 * MiB
    await rig.watchdog.check()
    rig.worker(rec).exit(-9)
    assert (rec.state, rec.restarts) == (state, restarts)
    assert "memory_cap_exceeded: 11 MiB in use, cap 10 MiB" in rec.reason


@in_loop
async def test_shutdown_cancels_pending_restarts_and_stops_every_worker(rig: Rig) -> None:
    crashed, running = rig.task(), rig.task()
    await rig.sup.start(crashed)
    await rig.sup.start(running)
    rig.worker(crashed).exit(1)
    (restart,) = rig.timers.pending()
    worker = rig.worker(running)
    stopping = asyncio.ensure_future(rig.sup.shutdown())
    await worker.killed.wait()
    assert restart.cancelled
    assert worker.kills == ["agent shutting down"]  # not attached: killed rather than asked
    worker.exit(-9)
    await stopping
    assert running.state is TaskState.STARTING  # left for the next agent to resume


# -- a task that waits for a resource (it raised Unavailable) --------------------------------------
BUBBLE_NS = 10_000_000  # the scheduler's clock stands at 0: a bubble starting at 0 leaves ~10 ms to grant


def bubble(rig: Rig, iteration: int) -> None:
    """The previous bubble ends and the next one starts: a window opens for whichever task is a candidate."""
    if iteration:
        rig.scheduler.on_bubble(Edge(False, True, rank=0, slot=0, iteration=iteration - 1, time_ns=0))
    rig.scheduler.on_bubble(Edge(True, True, rank=0, slot=0, iteration=iteration, time_ns=0,
                                 expected_duration_ns=BUBBLE_NS))


def grants(worker: FakeWorker) -> list[int]:
    return [call[1] for call in worker.window.calls if call[0] == "grant"]


def attach(rig: Rig, task_id: str, instance: int) -> asyncio.Queue[Control | None]:
    """The worker's stream: what the supervisor sends it lands in the returned queue."""
    outbox: asyncio.Queue[Control | None] = asyncio.Queue()
    rig.streams.attach(task_id, instance, outbox)
    return outbox


async def ready_task(rig: Rig) -> tuple[TaskRecord, FakeWorker]:
    rec = rig.task()
    await rig.sup.start(rec)
    worker = rig.worker(rec)
    rig.streams.on_worker_message(rec.id, worker.instance, Ready("iterative", 0, {}))
    return rec, worker


@in_loop
async def test_a_waiting_task_gets_no_window_says_why_and_is_scheduled_again_when_its_resource_is_back(
    rig: Rig,
) -> None:
    rec, worker = await ready_task(rig)
    bubble(rig, 0)
    assert grants(worker) == [1]
    rig.changes.clear()
    # The worker gives window 1 back (its step raised Unavailable), then says it waits: in that order.
    rig.streams.on_worker_message(rec.id, worker.instance, WindowDone(1, idle_since_ns=5, step_estimate_ns=0))
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("redis at db:6379 does not answer", True))
    assert rec.id not in rig.scheduler.tasks  # no candidate, no window, no step that could hang
    assert (rec.state, rec.reason) == (TaskState.READY, "waiting: redis at db:6379 does not answer")
    assert rig.changes == [(rec.id, TaskState.READY, Change.REASON)]  # announced to watchers, written at once
    for it in (1, 2, 3):
        bubble(rig, it)
    assert grants(worker) == [1]
    assert worker.kills == [] and rig.table.worker(rec.id) is worker
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("redis at db:6379 does not answer", False))
    assert (rec.state, rec.reason) == (TaskState.READY, "")
    assert grants(worker) == [1, 4]  # the open window goes to it at once, as after its Ready
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("redis at db:6379 does not answer", False))
    assert list(rig.scheduler.tasks) == [rec.id] and grants(worker) == [1, 4]  # a repeat changes nothing


@in_loop
async def test_a_window_granted_before_the_waiting_message_arrived_goes_to_another_task(rig: Rig) -> None:
    waiter, w1 = await ready_task(rig)
    bubble(rig, 0)
    other, w2 = await ready_task(rig)  # window 1 is held: the other task waits for the next bubble
    rig.streams.on_worker_message(waiter.id, w1.instance, WindowDone(1, idle_since_ns=5, step_estimate_ns=0))
    assert grants(w2) == [1]  # the rest of window 1
    bubble(rig, 1)  # window 2: the waiter looks idle, and its Waiting is still on the way
    assert grants(w1) == [1, 2]
    rig.streams.on_worker_message(waiter.id, w1.instance, Waiting("disk full", True))
    rig.streams.on_worker_message(other.id, w2.instance, WindowDone(1, idle_since_ns=6, step_estimate_ns=0))
    assert grants(w2) == [1, 2]  # the worker never steps in window 2: it ignores grants made while it waits


@pytest.mark.parametrize(("desired", "control"), STOPS)
@in_loop
async def test_a_waiting_task_is_paused_or_cancelled_as_any_other_and_a_late_resume_message_is_ignored(
    rig: Rig, desired: TaskState, control: Control
) -> None:
    rec, worker = await ready_task(rig)
    outbox = attach(rig, rec.id, worker.instance)
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("down", True))
    rig.ask_stop(rec, desired, "by user")
    assert outbox.get_nowait() is control
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("down", False))  # sent before it read the control
    assert rec.id not in rig.scheduler.tasks and (rec.state, rec.reason) == (desired, "by user")
    worker.exit(0)
    assert rec.state is desired and rig.table.live == {}


@in_loop
async def test_a_waiting_reason_is_one_line_of_bounded_length(rig: Rig) -> None:
    rec, worker = await ready_task(rig)
    rig.streams.on_worker_message(rec.id, worker.instance, Waiting("no\nanswer  " + "x" * 1000, True))
    assert rec.reason.startswith("waiting: no answer xxx") and len(rec.reason) == len("waiting: ") + 200


@in_loop
async def test_a_task_whose_steps_fit_no_bubble_says_why_until_one_fits(rig: Rig) -> None:
    rec, _worker = await ready_task(rig)
    rig.sup.fit(rec.id, 2_000_000_000, 60_000_000)  # the scheduler: passed over, and longer than any bubble seen
    assert (rec.state, rec.reason) == (
        TaskState.READY, "waiting: its steps (p95 2.00 s) do not fit any bubble (longest 60.0 ms)")
    rig.sup.fit(rec.id, 0, 0)  # granted a window it fits
    assert rec.reason == ""

"""The state disk fills up for real: a small tmpfs is the agent's whole state directory (tests/support/disk.py).

A chatty task's logs are held to the total budget; then the disk is filled to its last byte. An innocent task
whose checkpoint cannot be written, and a task resumed while nothing can be created, wait with a reason and are
charged no restart (they used to burn their restarts on ENOSPC and end FAILED); the doctor warns; `freeride rm`
of a finished task with a large checkpoint succeeds on the full disk, and both tasks go on at once. No
traceback in the agent's log, nothing left running, and the agent stops cleanly once it could write again.
"""

from __future__ import annotations

from pathlib import Path

from support.agents import FAST, BackgroundTrainer
from support.cli import run_freeride
from support.disk import fill, small_disk
from support.faults import assert_all_reaped, assert_no_tracebacks, ref, tagged_agent

from freeride.tooling.harness import WindowCollector, wait_for_info, wait_for_task
from freeride.v1 import tasks_pb2

S = tasks_pb2
MiB = 1 << 20
LOG_TOTAL = 256 << 10
ARGS = [*FAST, "--log-max-bytes", "64KiB", "--log-total-bytes", str(LOG_TOTAL), "--max-restarts", "3"]
DISK_FULL = "waiting: disk full: "
LIVE = [S.TASK_STATE_READY, S.TASK_STATE_RUNNING]  # (RUNNING while it holds a window)


def logs_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in (state / "logs").glob("task-*.log*"))


def steps_of(task_id: str, windows: list[S.WindowRecord]) -> int:
    return sum(share.steps for w in windows for share in w.shares if share.task_id == task_id)


def test_a_full_state_disk_makes_tasks_wait_not_fail_and_rm_frees_it(tmp_path: Path) -> None:
    with small_disk(tmp_path / "state", 24 * MiB) as state:
        agent = tagged_agent(state, extra_args=ARGS).start()
        try:
            with agent.client() as c, WindowCollector(c) as windows, BackgroundTrainer(agent, [10.0]) as trainer:
                # The chatty task prints 4 KiB a step, 200 steps: 3x the logs' total, which they never pass.
                chatty = c.submit(S.TaskSpec(ref=ref("behaviours", "Prints"),
                                             args={"line_bytes": "4096", "steps": "200"})).id
                big = c.submit(S.TaskSpec(ref=ref("behaviours", "Ballast"),
                                          args={"ballast_bytes": str(6 * MiB), "steps": "30"})).id
                innocent = c.submit(S.TaskSpec(ref=ref("behaviours", "Counter"))).id
                later = c.submit(S.TaskSpec(ref=ref("behaviours", "Counter"))).id
                wait_for_task(c, big, [S.TASK_STATE_DONE], 60)
                wait_for_task(c, later, LIVE)
                c.pause(later)
                # PAUSED at once; its worker checkpoints, exits and closes its files after: all before the disk fills
                wait_for_info(c, later, lambda t: t.state == S.TASK_STATE_PAUSED and t.pid == 0)
                wait_for_task(c, chatty, [S.TASK_STATE_DONE], 60)
                assert logs_bytes(state) <= LOG_TOTAL

                fill(state / "filler")  # the disk's last byte is taken
                full = wait_for_info(c, innocent, lambda t: t.reason.startswith(DISK_FULL), 30)
                assert "its checkpoint cannot be written" in full.reason and "No space left" in full.reason
                c.resume(later)  # its worker's window word cannot be created ...
                wait_for_info(c, later, lambda t: t.reason.startswith(DISK_FULL), 30)
                # ... or, where the agent's own failed database write had just freed its journal's few KiB (the
                # resume is a write: a race for the disk's last bytes, seen once with three test workers), its
                # worker started and its checkpoint cannot be written. Either way it waits, charged nothing.
                during = len(windows.windows)
                # Bubbles go on meanwhile, well past a restart's backoff (the agent, with no task that could take a
                # window, is quiet: it grants none, but counts them).
                bubbles = c.stats().gpu.bubbles
                assert trainer.wait_iterations(50, 30)
                assert c.stats().gpu.bubbles >= bubbles + 50
                for task_id in (innocent, later):
                    t = c.get(task_id)
                    files = t.reason.startswith(DISK_FULL + "its worker's files")
                    assert files or t.reason.startswith(DISK_FULL + "its checkpoint cannot be written"), t.reason
                    state_now = S.TASK_STATE_STARTING if files else S.TASK_STATE_READY
                    assert (t.state, t.restarts) == (state_now, 0), t  # waiting (no window): not FAILED, no restart
                    if task_id == later and files:
                        assert not list((state / "run").glob(f"task-{later}-*.win"))  # its tries left no empty file
                assert steps_of(innocent, windows.windows[during + 5:]) == 0  # it holds no window while it waits

                doctor = run_freeride("doctor", "--state-dir", str(state), "--fake-gpu")
                assert "[WARN] state-disk" in doctor.stdout and "--disk-warn-percent 90" in doctor.stdout, doctor

                # rm on the full disk: its files go first, then its row
                removed = run_freeride("rm", big, "--agent", str(agent.socket))
                assert removed.returncode == 0, removed
                assert not list(state.glob(f"*/task-{big}.*"))
                assert big not in [t.id for t in c.list()]
                # Space is back: both go on at once (not at their next backoff), with no restart charged.
                back = wait_for_info(c, innocent, lambda t: not t.reason.startswith(DISK_FULL), 30)
                assert back.state in (S.TASK_STATE_READY, S.TASK_STATE_RUNNING) and back.restarts == 0
                since = len(windows.windows)
                assert windows.wait_until(lambda ws: steps_of(innocent, ws[since:]) >= 20, 30)  # counting on
                started = wait_for_task(c, later, LIVE)
                assert started.restarts == 0 and not started.reason.startswith(DISK_FULL)
            (state / "filler").unlink()
            assert agent.stop() == 0, agent.log_tail()  # everything was written once the disk had room
            assert_no_tracebacks(agent)
        finally:
            agent.stop()
            assert_all_reaped(agent.tag)

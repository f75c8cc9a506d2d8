"""The control path: bubble edges in, windows granted to and revoked from workers, harvest accounted.

Pure logic, no I/O: the agent injects the clock, a timer and each task's send function, so
every decision here is unit-testable and every wake-up is an event (a bubble edge, a worker
message, or a timer set for a known instant).

Here: bubbles become windows, windows are granted, revoked and handed on, hung steps are caught.
Its parts, each with one job: bubbles.py (the open bubble per rank, the predictions, what each END
taught), slots.py (the resident tasks, the candidates, the starved probe), reprobe.py (a task that fits no bubble
offered windows again, later), windows.py (the data),
accounting.py and history.py (pure functions over a closed window and over the kept ones).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from freeride.agent.config import WorkerConfig
from freeride.agent.control.accounting import account
from freeride.agent.control.bubbles import Bubbles
from freeride.agent.control.history import HISTORY_BUBBLES, HISTORY_MAX_STEPS, HISTORY_WINDOWS, history
from freeride.agent.control.idle import IdleBound
from freeride.agent.control.policy import RecentUsage, choose
from freeride.agent.control.predictor import MarginController
from freeride.agent.control.reprobe import Reprobes
from freeride.agent.control.slots import TaskSlot, WindowPort, candidates, could_take_a_window, starved
from freeride.agent.control.windows import TaskShare, Window
from freeride.agent.domain.events import BubbleSpan, Edge, Steps, WindowDone, WindowRecord
from freeride.agent.domain.model import Counters
from freeride.agent.domain.timers import CallAt, Clock, TimerHandle

__all__ = ["HISTORY_BUBBLES", "HISTORY_MAX_STEPS", "HISTORY_WINDOWS", "Scheduler", "SchedulerConfig", "TaskSlot",
           "WindowPort"]

log = logging.getLogger(__name__)


@dataclass
class SchedulerConfig:
    margin_ns: int = 200_000
    min_window_ns: int = 200_000
    hang_timeout_ns: int = 5_000_000_000
    hang_factor: float = 20.0
    fair_share_half_life_ns: int = 30_000_000_000  # harvest this old counts half in the fair share

    @classmethod
    def of(cls, workers: WorkerConfig) -> SchedulerConfig:
        """The scheduler's settings from the workers' concern (--margin-ms, --hang-timeout-s)."""
        return cls(margin_ns=int(workers.margin_ms * 1e6), hang_timeout_ns=int(workers.hang_timeout_s * 1e9))


class Scheduler:
    def __init__(
        self,
        clock: Clock,
        call_at: CallAt,
        config: SchedulerConfig,
        on_account: Callable[[WindowRecord, dict[str, Counters], Counters], None],
        on_hang: Callable[[str, int], None],
        on_fit: Callable[[str, int, int], None] | None = None,
        on_demand: Callable[[bool], None] | None = None,
    ) -> None:
        self._clock = clock
        self._call_at = call_at
        self._cfg = config
        self._on_account = on_account
        self._on_hang = on_hang
        # (task id, its step estimate, the longest bubble seen) when its steps fit no bubble; (task id, 0, 0) when
        # it is granted a window it fits again
        self._on_fit = on_fit or (lambda task_id, estimate_ns, longest_ns: None)
        # Told when `wants_edges` is about to change, before it does: the agent reads what its trainers wrote
        # under the old answer, then asks for a wake-up per edge (True) or lets edges wait unannounced (False).
        self._on_demand = on_demand or (lambda wanted: None)
        self.wants_edges = False  # a task could take a window, or holds one: each edge matters as it comes
        self._relisten: TimerHandle | None = None  # set for now once a longer bubble fits a task that fit none
        self.margin = MarginController(config.margin_ns)
        self.usage = RecentUsage(config.fair_share_half_life_ns)  # per task id: survives a worker's restart
        self.tasks: dict[str, TaskSlot] = {}
        self.reprobes = Reprobes(clock, call_at, self.tasks, self._update_demand)  # a task that fits no bubble
        self.bubbles = Bubbles()
        self.idle = IdleBound()  # what a rank's bubbles may add to the ledger: no more time than has passed
        self._windows: dict[int, Window] = {}
        self._current: Window | None = None
        self._next_window = 1
        self.gpu = Counters()
        self.prediction_errors = self.bubbles.prediction_errors
        self.event_delays_ns: deque[int] = deque(maxlen=1024)
        self.trainer_free_memory_bytes = 0
        self.bubble_lengths = self.bubbles.lengths  # read by the metrics endpoint
        self.window_history: deque[Window] = deque(maxlen=HISTORY_WINDOWS)  # for timelines, kept by reference

    @property
    def windows_granted(self) -> int:
        return self._next_window - 1

    # -- trainer side ------------------------------------------------------------------------------
    def on_bubble(self, ev: Edge) -> None:
        self.gpu.events += 1
        now = self._clock()
        if self.wants_edges:  # else it was read late on purpose (see wants_edges): no delay to learn from
            self.event_delays_ns.append(now - ev.time_ns)
        if not ev.harvestable:
            return  # optimizer and data loading may use the GPU: reported, never harvested
        if ev.start:
            self._on_start(ev, now)
        else:
            self._on_end(ev)

    def _on_start(self, ev: Edge, seen_ns: int) -> None:
        if ev.free_memory_bytes > 0:
            self.trainer_free_memory_bytes = ev.free_memory_bytes
        stale = self.bubbles.replace(ev.rank)
        if stale is not None and stale.window is not None:
            self._close(stale.window, end_ns=0)  # its END was lost: account up to the prediction
        bubble = self.bubbles.start(ev)
        predicted = bubble.predicted_ns
        if predicted is None or self._current is not None:
            return
        until = ev.time_ns + predicted - self.margin.margin_ns()
        if until - seen_ns < self._cfg.min_window_ns:  # (seen_ns: now, read once on the way to the grant)
            # A bubble skipped for the margin counts as a clean one: with no window there is no clean
            # window to decay it, so after a burst of overruns short bubbles would never be used again.
            self.margin.on_window(0)
            return
        w = Window(self._next_window, ev.rank, ev.slot, ev.iteration, ev.time_ns, until, predicted, seen_ns)
        self._next_window += 1
        bubble.window = w
        self._windows[w.id] = w
        self._current = w
        self._dispatch(w)  # before the timer: nothing in between can close the window, and a grant is waited for
        w.timer = self._call_at(until, lambda: self._close(w, end_ns=0))

    def _on_end(self, ev: Edge) -> None:
        bubble = self.bubbles.end(ev)
        if bubble is None:
            return  # an END whose START we never saw (reconnect): nothing to learn from
        if not self.wants_edges and self._relisten is None and self.tasks:  # quiet: could a task fit now? If so, the
            # agent listens from a timer set for now, not here: this END is delivered while a ring is read, and
            # listening reads the rings first
            predicted = self.bubbles.predicted_ns(ev.rank, ev.slot)
            if any(t.fits_none and (t.step_estimate_ns or 0) <= predicted for t in self.tasks.values()):
                self._relisten = self._call_at(self._clock(), self._update_demand)
        length = ev.time_ns - bubble.start_ns
        if length > 0:  # a step that stands for several (a quiet trainer times only some) counts for all of them,
            # within the time that has passed (freeride.agent.control.idle)
            bubble_ns, bubbles = self.idle.credit(ev.rank, bubble.start_ns, ev.time_ns, bubble.stands_for)
            self.gpu.bubbles += bubbles
            self.gpu.bubble_ns += bubble_ns
        if bubble.window is not None:
            self._close(bubble.window, end_ns=ev.time_ns)
            bubble.window = None  # the bubble history must not keep windows (and their steps) alive
        if length > 0:
            self.bubble_lengths.observe(length)  # after the revoke: it only feeds /metrics

    def trainer_gone(self, rank: int) -> None:
        """A trainer stream ended: close its window now; its bubble never gets an END."""
        bubble = self.bubbles.replace(rank)
        self.idle.gone(rank)
        if bubble is not None and bubble.window is not None:
            self._close(bubble.window, end_ns=0)

    # -- demand ----------------------------------------------------------------------------------
    def _update_demand(self) -> None:
        """Recompute `wants_edges`: wanted while a task could take a window (slots.could_take_a_window) or a window a
        task ran in waits for its END (a finished task's last books); else edges only feed the profile, read late."""
        self._relisten = None
        wanted = (any(could_take_a_window(t, self.bubbles.longest_predicted_ns) for t in self.tasks.values())
                  or any(w.shares for w in self._windows.values()))
        if wanted != self.wants_edges:
            self._on_demand(wanted)
            self.wants_edges = wanted

    # -- windows ---------------------------------------------------------------------------------
    def _dispatch(self, w: Window) -> None:
        remaining = w.until_ns - self._clock()
        if remaining < self._cfg.min_window_ns:
            return
        offered = candidates(self.tasks, self.usage)
        pick = choose(offered, remaining, w.tried)
        probe, fits_none = starved(self.tasks, offered, remaining, w.tried, self.bubbles.longest_predicted_ns)
        for slot in fits_none:
            self._on_fit(slot.task_id, slot.step_estimate_ns or 0, self.bubbles.longest_predicted_ns())
            self.reprobes.arm(slot)
        if probe is not None and (pick is None or probe.priority >= pick.priority):  # priority still rules
            pick = probe
        if pick is None:
            return
        task = self.tasks[pick.task_id]
        if task.fits_none and pick is not probe:  # a window it fits (a probe is not one: it may not step)
            self.reprobes.fits_again(task)
            self._on_fit(task.task_id, 0, 0)
        elif pick is probe:
            self.reprobes.probed(task)
        task.port.grant(w.id, w.until_ns)  # first: the worker wakes while the books below are kept
        w.shares.append(TaskShare(task.task_id, granted_ns=self._clock()))
        task.unfit = 0
        w.holder = task.task_id
        w.tried.add(task.task_id)
        task.window_id = w.id

    def _close(self, w: Window, end_ns: int) -> None:
        if end_ns:
            w.end_ns = end_ns
        if w.open:
            w.open = False
            if w.timer is not None:
                w.timer.cancel()
            if self._current is w:
                self._current = None
            if w.holder:
                task = self.tasks[w.holder]
                task.port.revoke(w.id, w.until_ns)
                if not task.checkpointing:  # a checkpoint is no step: its own deadline bounds it
                    self._arm_hang_timer(task)
        self._maybe_account(w)

    def _arm_hang_timer(self, task: TaskSlot) -> None:
        est = task.step_estimate_ns or 0
        deadline = self._clock() + max(self._cfg.hang_timeout_ns, int(self._cfg.hang_factor * est))
        wid = task.window_id
        task.hang_timer = self._call_at(deadline, lambda: self._hung(task.task_id, wid))

    def _hung(self, task_id: str, window_id: int) -> None:
        task = self.tasks.get(task_id)
        if task is not None and task.window_id == window_id:
            task.counters.killed_steps += 1
            w = self._windows.get(window_id)
            share = w.share(task_id) if w is not None else None
            if share is not None:
                share.killed_at_ns = self._clock()  # the time it ran past the window is overrun (accounted)
            self._on_hang(task_id, window_id)

    # -- worker side -----------------------------------------------------------------------------
    def add_task(self, task: TaskSlot) -> None:
        self.tasks[task.task_id] = task
        w = self._current
        if w is not None and w.open and not w.holder:
            self._dispatch(w)
        self._update_demand()

    def stop_granting(self, task_id: str) -> None:
        """The task's worker was asked to checkpoint and exit (pause, cancel, shutdown): no new window for it.

        A window it holds ends as usual (its step in progress stays under the hang timer until the worker
        says WindowDone); what follows, state_dict() and the write, is no step: a window granted then would
        be one it cannot answer, and its hang timer would kill the checkpoint.
        """
        task = self.tasks.get(task_id)
        if task is not None:
            task.stopping = True
            self._update_demand()

    def checkpointing(self, task_id: str, active: bool) -> None:
        """The task's worker began (or ended) a checkpoint: no step, so no new window and no hang timer meanwhile.

        It says so only while it holds no window, so a window it holds now was granted after its WindowDone
        and before this message, unseen: it stays held (the worker answers it once the checkpoint ends, as
        revoked if the bubble is over by then), with no hang timer until then. The supervisor bounds the
        checkpoint itself by --checkpoint-timeout-s.
        """
        task = self.tasks.get(task_id)
        if task is None or task.checkpointing == active:
            return
        task.checkpointing = active
        if active:
            task.disarm_hang()
            self._update_demand()
            return
        w = self._windows.get(task.window_id)
        if w is not None and w.holder == task_id and not w.open and task.hang_timer is None:
            self._arm_hang_timer(task)  # from now on it answers as any idle worker does
        current = self._current
        if current is not None and current.open and not current.holder:
            self._dispatch(current)
        self._update_demand()

    def remove_task(self, task_id: str) -> None:
        """The task's worker is gone: release whatever window it held."""
        task = self.tasks.pop(task_id, None)
        if task is None:
            return
        task.disarm_hang()
        self.reprobes.stop(task)
        w = self._windows.get(task.window_id)
        if w is not None and w.holder == task_id:
            w.holder = ""
            if w.open:
                self._dispatch(w)
            else:
                self._maybe_account(w)
        self._update_demand()

    def on_steps(self, task_id: str, report: Steps) -> None:
        w = self._windows.get(report.window_id)
        share = w.share(task_id) if w is not None else None
        if share is not None:
            share.steps.extend(report.steps)

    def on_window_done(self, task_id: str, done: WindowDone) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.window_id != done.window_id:
            return
        task.window_id = 0
        task.disarm_hang()
        if done.step_estimate_ns > 0:
            task.step_estimate_ns = done.step_estimate_ns
        w = self._windows.get(done.window_id)
        if w is not None:
            self._window_done(task_id, done, w)
        # It gave back a window: the last it may hold (stopping), or a probe whose estimate fits no bubble still
        self._update_demand()

    def _window_done(self, task_id: str, done: WindowDone, w: Window) -> None:
        share = w.share(task_id)
        if share is not None:
            share.idle_since_ns, share.woke_ns = done.idle_since_ns, done.woke_ns
        w.holder = ""
        if w.open:
            self._dispatch(w)  # tail filling: the rest of the bubble goes to a task whose steps fit
        else:
            self._maybe_account(w)
            current = self._current  # a newer window that opened while this task was still busy
            if current is not None and current.open and not current.holder:
                self._dispatch(current)

    # -- accounting ------------------------------------------------------------------------------
    def _maybe_account(self, w: Window) -> None:
        """Account a window once it is closed, its holder is idle, and its bubble end is known."""
        if w.open or w.holder or w.id not in self._windows:
            return
        bubble = self.bubbles.open.get(w.rank)
        if not w.end_ns and bubble is not None and bubble.window is w:
            return  # closed at until; END still to come
        del self._windows[w.id]
        books = account(w)
        self.margin.on_window(books.steps_overrun_ns)
        w.record = books.record
        self.window_history.append(w)
        now = self._clock()
        for task_id, c in books.per_task.items():
            self.usage.add(task_id, c.harvested_ns, now)
        self.gpu.add(books.total)
        self._on_account(books.record, books.per_task, books.total)
        if w.shares and self.wants_edges:  # the edges may have been wanted for this END alone
            self._update_demand()

    # -- history ---------------------------------------------------------------------------------
    def history(self, since_ns: int = 0,
                max_steps: int = HISTORY_MAX_STEPS) -> tuple[list[BubbleSpan], list[WindowRecord]]:
        """The kept bubbles and accounted windows that end after `since_ns` (see freeride.agent.control.history)."""
        return history(self.bubbles.history, self.window_history, since_ns, max_steps)

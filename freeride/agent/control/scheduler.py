"""The control path: bubble edges in, windows granted to and revoked from workers, harvest accounted.

Pure logic, no I/O: the agent injects the clock, a timer and each task's send function, so
every decision here is unit-testable and every wake-up is an event (a bubble edge, a worker
message, or a timer set for a known instant).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from freeride.agent.control.histogram import Histogram
from freeride.agent.control.policy import Candidate, RecentUsage, choose
from freeride.agent.control.predictor import MarginController, SlotPredictor
from freeride.agent.domain.events import BubbleSpan, Edge, Share, Steps, WindowDone, WindowRecord
from freeride.agent.domain.model import Counters
from freeride.agent.domain.timers import CallAt, Clock, TimerHandle

log = logging.getLogger(__name__)

_MIN_ERROR_BUBBLE_NS = 1_000_000  # relative errors of sub-millisecond bubbles say nothing useful
_MAX_SLOTS = 4096  # per agent; a runaway slot numbering must not grow memory without bound
HISTORY_BUBBLES = 4096  # bubbles kept for `freeride timeline` (a few hundred iterations)
HISTORY_WINDOWS = 512  # accounted windows kept with their steps (the steps make these the heavier ones)
HISTORY_MAX_STEPS = 50_000  # steps in one history answer (one Timeline message): about 1 MB
# A task passed over this many times because its step estimate did not fit is offered a window
# anyway: its worker re-checks (and drops a stale outlier from) its estimate instead of starving.
_PROBE_AFTER = 16


class WindowPort(Protocol):
    """How the scheduler reaches one worker's window word (see freeride.core.window)."""

    def grant(self, window_id: int, until_ns: int) -> None: ...
    def revoke(self, window_id: int, until_ns: int) -> None: ...




@dataclass
class TaskSlot:
    """A resident task as the scheduler sees it."""

    task_id: str
    priority: int
    port: WindowPort
    counters: Counters
    step_estimate_ns: int | None = None
    window_id: int = 0  # the window this task holds, 0 when idle
    hang_timer: TimerHandle | None = None
    unfit: int = 0  # dispatches it sat out since its last window because its estimate did not fit
    fits_none: bool = False  # told (on_fit) that its estimate fits no bubble seen; cleared when one fits
    stopping: bool = False  # asked to checkpoint and exit: no new window (one it holds ends as usual)
    checkpointing: bool = False  # its worker is in a checkpoint: no new window, no hang timer


@dataclass(slots=True)  # made per grant, on the path to it: no instance dict
class _Share:
    task_id: str
    steps: list[tuple[int, int]] = field(default_factory=list)
    idle_since_ns: int = 0  # the worker's clock when it reported WindowDone (an instant); 0: it never did
    granted_ns: int = 0  # when the grant was written
    woke_ns: int = 0  # when the worker saw it (from its WindowDone); 0: unknown
    killed_at_ns: int = 0  # its step hung past the window and was killed at this instant; 0: it was not


@dataclass(slots=True)
class Window:
    id: int
    rank: int
    slot: int
    iteration: int
    start_ns: int
    until_ns: int
    predicted_ns: int
    seen_ns: int = 0  # when the agent took the START edge
    end_ns: int = 0
    open: bool = True
    holder: str = ""
    tried: set[str] = field(default_factory=set)
    shares: list[_Share] = field(default_factory=list)
    timer: TimerHandle | None = None
    record: WindowRecord | None = None  # set when accounted


@dataclass(slots=True)
class _Bubble:
    slot: int
    iteration: int
    start_ns: int
    predicted_ns: int | None
    window: Window | None
    rank: int = 0
    end_ns: int = 0
    kind: int = 0


@dataclass
class SchedulerConfig:
    margin_ns: int = 200_000
    min_window_ns: int = 200_000
    hang_timeout_ns: int = 5_000_000_000
    hang_factor: float = 20.0
    fair_share_half_life_ns: int = 30_000_000_000  # harvest this old counts half in the fair share


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
        self.longest_bubble_ns = 0  # the longest bubble seen since the agent started
        self.margin = MarginController(config.margin_ns)
        self.usage = RecentUsage(config.fair_share_half_life_ns)  # per task id: survives a worker's restart
        self.tasks: dict[str, TaskSlot] = {}
        self._predictors: OrderedDict[tuple[int, int], SlotPredictor] = OrderedDict()
        self._bubbles: dict[int, _Bubble] = {}
        self._windows: dict[int, Window] = {}
        self._current: Window | None = None
        self._next_window = 1
        self.gpu = Counters()
        self.prediction_errors: deque[float] = deque(maxlen=1024)
        self.event_delays_ns: deque[int] = deque(maxlen=1024)
        self.trainer_free_memory_bytes = 0
        self.bubble_lengths = Histogram()  # since the agent started; read by the metrics endpoint
        # Recent history for timelines: the objects the control path made anyway, kept by reference.
        self.bubble_history: deque[_Bubble] = deque(maxlen=HISTORY_BUBBLES)
        self.window_history: deque[Window] = deque(maxlen=HISTORY_WINDOWS)

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

    def _predictor(self, rank: int, slot: int) -> SlotPredictor:
        key = (rank, slot)
        p = self._predictors.get(key)
        if p is None:
            p = self._predictors[key] = SlotPredictor()
            if len(self._predictors) > _MAX_SLOTS:
                self._predictors.popitem(last=False)
        else:
            self._predictors.move_to_end(key)
        return p

    def _on_start(self, ev: Edge, seen_ns: int) -> None:
        if ev.free_memory_bytes > 0:
            self.trainer_free_memory_bytes = ev.free_memory_bytes
        stale = self._bubbles.pop(ev.rank, None)
        if stale is not None and stale.window is not None:
            self._close(stale.window, end_ns=0)  # its END was lost: account up to the prediction
        predicted = self._predictor(ev.rank, ev.slot).predict_ns()
        if predicted is None and ev.expected_duration_ns > 0:
            predicted = ev.expected_duration_ns
        bubble = _Bubble(ev.slot, ev.iteration, ev.time_ns, predicted, None, ev.rank, kind=ev.kind)
        self._bubbles[ev.rank] = bubble
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
        bubble = self._bubbles.get(ev.rank)
        if bubble is None or bubble.slot != ev.slot:
            return  # an END whose START we never saw (reconnect): nothing to learn from
        del self._bubbles[ev.rank]
        length = ev.time_ns - bubble.start_ns
        if length > 0:
            self.gpu.bubbles += 1
            self.gpu.bubble_ns += length
            if bubble.predicted_ns is not None and length >= _MIN_ERROR_BUBBLE_NS:
                self.prediction_errors.append(abs(bubble.predicted_ns - length) / length)
            self._predictor(ev.rank, ev.slot).observe(length)
            self.longest_bubble_ns = max(self.longest_bubble_ns, length)
            bubble.end_ns = ev.time_ns
            self.bubble_history.append(bubble)
        if bubble.window is not None:
            self._close(bubble.window, end_ns=ev.time_ns)
            bubble.window = None  # the bubble history must not keep windows (and their steps) alive
        if length > 0:
            self.bubble_lengths.observe(length)  # after the revoke: it only feeds /metrics

    def trainer_gone(self, rank: int) -> None:
        """A trainer stream ended: close its window now; its bubble never gets an END."""
        bubble = self._bubbles.pop(rank, None)
        if bubble is not None and bubble.window is not None:
            self._close(bubble.window, end_ns=0)

    # -- demand ----------------------------------------------------------------------------------
    def _update_demand(self) -> None:
        """Recompute `wants_edges` after a task came, went, stopped or gave a window back.

        Edges are wanted while some task could be granted a window, or holds one (its END revokes it);
        otherwise they only feed the profile (bubble lengths, predictions), which may read them late."""
        wanted = any(not (t.stopping or t.checkpointing) or t.window_id for t in self.tasks.values())
        if wanted != self.wants_edges:
            self._on_demand(wanted)
            self.wants_edges = wanted

    # -- windows ---------------------------------------------------------------------------------
    def _candidates(self) -> list[Candidate]:
        return [
            Candidate(t.task_id, t.priority, self.usage.score(t.task_id), t.step_estimate_ns, t.window_id == 0)
            for t in self.tasks.values() if not (t.stopping or t.checkpointing)
        ]

    def _dispatch(self, w: Window) -> None:
        remaining = w.until_ns - self._clock()
        if remaining < self._cfg.min_window_ns:
            return
        candidates = self._candidates()
        pick = choose(candidates, remaining, w.tried)
        starved = self._starved(candidates, remaining, w.tried)
        if starved is not None and (pick is None or starved.priority >= pick.priority):  # priority still rules
            pick = starved
        if pick is None:
            return
        task = self.tasks[pick.task_id]
        if task.fits_none and pick is not starved:  # a window it fits (a probe is not one: it may not step)
            task.fits_none = False
            self._on_fit(task.task_id, 0, 0)
        task.port.grant(w.id, w.until_ns)  # first: the worker wakes while the books below are kept
        w.shares.append(_Share(task.task_id, granted_ns=self._clock()))
        task.unfit = 0
        w.holder = task.task_id
        w.tried.add(task.task_id)
        task.window_id = w.id

    def _starved(self, candidates: list[Candidate], remaining_ns: int, tried: set[str]) -> Candidate | None:
        """An idle task that sat out `_PROBE_AFTER` dispatches because its estimate did not fit.

        Its estimate may be one step slowed by a loaded machine, and only a window can refresh it:
        the worker runs a step only if it fits by its own estimate, so a probe costs no overrun.
        """
        probe = None
        for c in candidates:
            unfit = c.step_estimate_ns is not None and c.step_estimate_ns > remaining_ns
            if c.idle and unfit and c.task_id not in tried:
                slot = self.tasks[c.task_id]
                slot.unfit += 1
                estimate_ns = c.step_estimate_ns or 0
                if slot.unfit >= _PROBE_AFTER and not slot.fits_none and estimate_ns > self.longest_bubble_ns:
                    slot.fits_none = True  # said once, until a window it fits
                    self._on_fit(c.task_id, estimate_ns, self.longest_bubble_ns)
                if probe is None and slot.unfit >= _PROBE_AFTER:
                    probe = c
        return probe

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
            share = next((s for s in reversed(w.shares) if s.task_id == task_id), None) if w is not None else None
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
            if task.hang_timer is not None:
                task.hang_timer.cancel()
                task.hang_timer = None
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
        if task.hang_timer is not None:
            task.hang_timer.cancel()
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
        if w is None:
            return
        for share in reversed(w.shares):
            if share.task_id == task_id:
                share.steps.extend(report.steps)
                return

    def on_window_done(self, task_id: str, done: WindowDone) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.window_id != done.window_id:
            return
        task.window_id = 0
        if task.hang_timer is not None:
            task.hang_timer.cancel()
            task.hang_timer = None
        if done.step_estimate_ns > 0:
            task.step_estimate_ns = done.step_estimate_ns
        w = self._windows.get(done.window_id)
        if w is not None:
            self._window_done(task_id, done, w)
        if task.stopping or task.checkpointing:  # it gave back the last window it may hold
            self._update_demand()

    def _window_done(self, task_id: str, done: WindowDone, w: Window) -> None:
        for share in reversed(w.shares):
            if share.task_id == task_id:
                share.idle_since_ns = done.idle_since_ns
                share.woke_ns = done.woke_ns
                break
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
        bubble = self._bubbles.get(w.rank)
        if not w.end_ns and bubble is not None and bubble.window is w:
            return  # closed at until; END still to come
        del self._windows[w.id]
        end = w.end_ns or (w.start_ns + w.predicted_ns)
        shares = []
        per_task: dict[str, Counters] = {}
        window_overrun = 0
        for share in w.shares:
            c = per_task.setdefault(share.task_id, Counters())
            c.windows += 1
            c.bubbles, c.bubble_ns = 1, end - w.start_ns  # the bubble this task had a share of
            busy = 0
            overrun = 0
            for start, duration in share.steps:
                stop = start + duration
                busy += duration
                if stop > end:
                    c.overrun_steps += 1
                    overrun += stop - max(start, end)
            c.steps += len(share.steps)
            c.harvested_ns += busy - overrun
            window_overrun += overrun  # (the margin learns from steps that ran long, not from a hang)
            if share.killed_at_ns:  # the hung step: from the bubble's end (or its own later start) to its kill
                last_stop = max((start + duration for start, duration in share.steps), default=0)
                c.overrun_steps += 1
                overrun += max(0, share.killed_at_ns - max(end, last_stop))
            c.overrun_ns += overrun
            shares.append(Share(
                task_id=share.task_id,
                first_step_ns=share.steps[0][0] if share.steps else 0,
                idle_since_ns=share.idle_since_ns,
                steps=len(share.steps),
                busy_ns=busy,
                overrun_ns=overrun,
                granted_ns=share.granted_ns,
                woke_ns=share.woke_ns,
            ))
        record = WindowRecord(
            window_id=w.id,
            rank=w.rank,
            slot=w.slot,
            iteration=w.iteration,
            bubble_start_ns=w.start_ns,
            bubble_end_ns=end,
            until_ns=w.until_ns,
            predicted_ns=w.predicted_ns,
            shares=tuple(shares),
            seen_ns=w.seen_ns,
        )
        self.margin.on_window(window_overrun)
        w.record = record
        self.window_history.append(w)
        total = Counters()
        now = self._clock()
        for task_id, c in per_task.items():
            total.add(c)
            self.usage.add(task_id, c.harvested_ns, now)
        total.windows = 1
        total.bubbles = total.bubble_ns = 0  # the GPU's bubbles are counted at their END, granted or not
        self.gpu.add(total)
        self._on_account(record, per_task, total)

    # -- history ---------------------------------------------------------------------------------
    def history(
        self, since_ns: int = 0, max_steps: int = HISTORY_MAX_STEPS
    ) -> tuple[list[BubbleSpan], list[WindowRecord]]:
        """The kept bubbles and accounted windows that end after `since_ns`; the newest windows'
        shares carry their steps, up to `max_steps` in all (the answer must fit one gRPC message)."""
        bubbles = [
            BubbleSpan(b.rank, b.slot, b.iteration, b.start_ns, b.end_ns, b.predicted_ns or 0, b.kind)
            for b in self.bubble_history if b.end_ns > since_ns
        ]
        windows = []
        budget = max_steps
        for w in reversed(self.window_history):
            if w.record is None or w.record.bubble_end_ns <= since_ns:
                continue
            shares = []
            for kept, share in zip(w.record.shares, w.shares, strict=True):
                if len(share.steps) <= budget:
                    budget -= len(share.steps)
                    kept = kept._replace(step_spans=share.steps)  # no longer written: the window is accounted
                shares.append(kept)
            windows.append(w.record._replace(shares=tuple(shares)))
        windows.reverse()
        return bubbles, windows

"""The trainers' bubbles as the scheduler sees them: the open one of each rank, a predictor per (rank, slot),
and what each END taught (prediction errors, the longest bubble, the lengths for /metrics, the history)."""

from __future__ import annotations

from collections import OrderedDict, deque

from freeride.agent.control.histogram import Histogram
from freeride.agent.control.history import HISTORY_BUBBLES
from freeride.agent.control.predictor import SlotPredictor
from freeride.agent.control.windows import Bubble
from freeride.agent.domain.events import Edge

_MIN_ERROR_BUBBLE_NS = 1_000_000  # relative errors of sub-millisecond bubbles say nothing useful
_MAX_SLOTS = 4096  # per agent; a runaway slot numbering must not grow memory without bound


class Bubbles:
    def __init__(self) -> None:
        self.open: dict[int, Bubble] = {}  # rank -> its bubble between START and END
        self._predictors: OrderedDict[tuple[int, int], SlotPredictor] = OrderedDict()
        self.longest_ns = 0  # the longest bubble seen since the agent started
        self.prediction_errors: deque[float] = deque(maxlen=1024)
        self.lengths = Histogram()  # since the agent started; read by the metrics endpoint
        self.history: deque[Bubble] = deque(maxlen=HISTORY_BUBBLES)  # for timelines, kept by reference

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

    def predicted_ns(self, rank: int, slot: int) -> int:
        """The length the slot's next bubble is predicted to have (0: none yet): what a window there could be."""
        p = self._predictors.get((rank, slot))
        return (p.predict_ns() or 0) if p is not None else 0

    def longest_predicted_ns(self) -> int:
        """The longest of the slots' predictions: the longest window the trainers' bubbles offer now. Unlike
        `longest_ns`, one long bubble (a job's first step, a stall) does not raise it: a prediction is the minimum
        of the slot's recent lengths, and only a run of longer ones replaces it (SlotPredictor)."""
        return max((p.predict_ns() or 0 for p in self._predictors.values()), default=0)

    def replace(self, rank: int) -> Bubble | None:
        """The rank's open bubble, taken out: a new START replaces it (its END was lost), or its trainer is gone."""
        return self.open.pop(rank, None)

    def start(self, ev: Edge) -> Bubble:
        """A START: the rank's new bubble, with its predicted length (its slot's history, else the trainer's word)."""
        predicted = self._predictor(ev.rank, ev.slot).predict_ns()
        if predicted is None and ev.expected_duration_ns > 0:
            predicted = ev.expected_duration_ns
        bubble = self.open[ev.rank] = Bubble(ev.slot, ev.iteration, ev.time_ns, predicted, None, ev.rank,
                                             kind=ev.kind, stands_for=ev.stands_for)
        return bubble

    def end(self, ev: Edge) -> Bubble | None:
        """An END: the bubble it closes, learnt from (None: its START was never seen, after a reconnect)."""
        bubble = self.open.get(ev.rank)
        if bubble is None or bubble.slot != ev.slot:
            return None
        del self.open[ev.rank]
        length = ev.time_ns - bubble.start_ns
        if length > 0:
            if bubble.predicted_ns is not None and length >= _MIN_ERROR_BUBBLE_NS:
                self.prediction_errors.append(abs(bubble.predicted_ns - length) / length)
            self._predictor(ev.rank, ev.slot).observe(length)
            self.longest_ns = max(self.longest_ns, length)
            bubble.end_ns = ev.time_ns
            self.history.append(bubble)
        return bubble

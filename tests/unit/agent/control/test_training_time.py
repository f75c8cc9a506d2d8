"""TrainingTime: the time with at least one trainer stream open, folded into the GPU's ledger."""

from __future__ import annotations

from support.clock import ManualClock

from freeride.agent.control.training import TrainingTime
from freeride.agent.domain.model import Counters


def test_only_time_with_a_stream_open_counts_and_overlapping_streams_count_once():
    clock, ledger = ManualClock(start_ns=1_000), Counters()
    t = TrainingTime(clock)
    clock.now_ns += 500  # no stream yet: not training
    t.fold(ledger)
    assert ledger.training_ns == 0
    t.opened()
    clock.now_ns += 100
    t.opened()  # a second rank on the same GPU: the same wall time, not twice
    clock.now_ns += 50
    t.closed(ledger)
    clock.now_ns += 25
    t.closed(ledger)  # the last stream ends the stretch
    assert ledger.training_ns == 175
    clock.now_ns += 1_000  # nobody connected
    t.fold(ledger)
    assert ledger.training_ns == 175


def test_each_read_of_the_ledger_carries_the_open_stretch_so_far_and_never_twice():
    clock, ledger = ManualClock(start_ns=1_000), Counters()
    t = TrainingTime(clock)
    t.opened()
    clock.now_ns += 300
    assert t.fold(ledger).training_ns == 300  # a stats call or a ledger write while training goes on
    assert t.fold(ledger).training_ns == 300  # read again at once: nothing new
    clock.now_ns += 200
    t.closed(ledger)
    assert ledger.training_ns == 500


def test_the_ledger_read_back_from_an_older_agent_has_no_training_time():
    assert Counters(**{"steps": 3, "harvested_ns": 7}).training_ns == 0

"""Specification of simulated pipeline bubble traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from freeride.tooling import trace
from freeride.tooling.trace import Segment

P, M, F_MS, B_MS = 4, 4, 20.0, 40.0


def ms(seconds: float) -> float:
    return seconds * 1e3


def bubbles(segments: list[Segment]) -> list[Segment]:
    return [s for s in segments if s.bubble]


@pytest.fixture(scope="module")
def one_f_one_b() -> list[list[list[Segment]]]:
    return trace.generate("1F1B", P, M, F_MS, B_MS, jitter=0.0, iterations=3)


def test_generate_returns_stage_major_iterations(one_f_one_b: list[list[list[Segment]]]) -> None:
    assert len(one_f_one_b) == P
    assert all(len(stage) == 3 for stage in one_f_one_b)


@pytest.mark.parametrize("stage", range(P))
def test_1f1b_idle_per_stage_is_p_minus_1_times_f_plus_b(
    one_f_one_b: list[list[list[Segment]]], stage: int
) -> None:
    for iteration in one_f_one_b[stage]:
        idle = sum(ms(s.duration_s) for s in bubbles(iteration))
        assert idle == pytest.approx((P - 1) * (F_MS + B_MS))  # 180 ms


@pytest.mark.parametrize("stage", range(P))
def test_1f1b_iteration_lasts_m_plus_p_minus_1_times_f_plus_b(
    one_f_one_b: list[list[list[Segment]]], stage: int
) -> None:
    for iteration in one_f_one_b[stage]:
        total = sum(ms(s.duration_s) for s in iteration)
        assert total == pytest.approx((M + P - 1) * (F_MS + B_MS))  # 420 ms


def test_1f1b_stage_1_bubbles_in_order(one_f_one_b: list[list[list[Segment]]]) -> None:
    lengths = [ms(s.duration_s) for s in bubbles(one_f_one_b[1][0])]
    non_zero = [x for x in lengths if x > 1e-9]
    assert non_zero == pytest.approx([20.0, 80.0, 20.0, 20.0, 40.0])


def test_every_stage_busy_time_is_m_forwards_and_backwards(one_f_one_b: list[list[list[Segment]]]) -> None:
    for stage in one_f_one_b:
        busy = sum(ms(s.duration_s) for s in stage[0] if not s.bubble)
        assert busy == pytest.approx(M * (F_MS + B_MS))


def test_last_bubble_of_each_iteration_is_the_drain(one_f_one_b: list[list[list[Segment]]]) -> None:
    for stage in one_f_one_b:
        assert stage[0][-1].bubble
        assert stage[0][-1].kind == trace.DRAIN


def test_slots_are_numbered_consecutively_within_an_iteration(one_f_one_b: list[list[list[Segment]]]) -> None:
    for stage in one_f_one_b:
        slots = [s.slot for s in bubbles(stage[0])]
        assert slots == list(range(len(slots)))


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_slot_numbers_are_identical_across_iterations_even_with_jitter(schedule: str) -> None:
    stages = trace.generate(schedule, P, M, F_MS, B_MS, jitter=0.05, iterations=6, seed=7)
    for stage in stages:
        layouts = [[(s.slot, s.kind) for s in bubbles(it)] for it in stage]
        assert all(layout == layouts[0] for layout in layouts)
        # jitter really changed the lengths, so the equality above is not trivial
        assert len({round(sum(s.duration_s for s in it), 12) for it in stage}) > 1


def test_same_seed_gives_the_same_trace() -> None:
    a = trace.generate("1f1b", P, M, F_MS, B_MS, jitter=0.1, iterations=2, seed=3)
    b = trace.generate("1f1b", P, M, F_MS, B_MS, jitter=0.1, iterations=2, seed=3)
    assert a == b


@pytest.mark.parametrize("stage", range(P))
def test_gpipe_idle_per_stage_is_also_p_minus_1_times_f_plus_b(stage: int) -> None:
    stages = trace.generate("gpipe", P, M, F_MS, B_MS, jitter=0.0, iterations=1)
    idle = sum(ms(s.duration_s) for s in bubbles(stages[stage][0]))
    assert idle == pytest.approx((P - 1) * (F_MS + B_MS))


def test_schedule_name_is_case_insensitive() -> None:
    assert trace.generate("GPIPE", 2, 2, 1.0, 2.0, 0.0, 1) == trace.generate("gpipe", 2, 2, 1.0, 2.0, 0.0, 1)


def test_unknown_schedule_raises_value_error() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        trace.generate("interleaved", P, M, F_MS, B_MS, jitter=0.0, iterations=1)


def test_save_then_load_round_trips_a_stage_trace(tmp_path: Path) -> None:
    stage_trace = trace.generate("1f1b", P, M, F_MS, B_MS, jitter=0.05, iterations=3, seed=1)[2]
    path = tmp_path / "stage2.json"
    trace.save(path, stage_trace)
    assert trace.load(path) == stage_trace


@pytest.mark.parametrize("content", ["not json", '[[{"duration_s": 1.0}]]', '[[{"bogus": 1}]]'])
def test_load_of_an_unreadable_trace_raises_value_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="cannot read trace"):
        trace.load(path)


def test_load_of_a_missing_file_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read trace"):
        trace.load(tmp_path / "absent.json")

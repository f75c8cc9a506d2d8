"""The profile's analysis and its what-if, in-process: theory, slot kinds, per-slot figures, the replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freeride.tooling import trace as tr
from freeride.tooling import whatif
from freeride.tooling.profile import analysis, recording
from freeride.v1 import trainer_pb2

MS = 1_000_000


def anchor_recording(iterations: int = 30) -> recording.Recording:
    """The anchor trace (1F1B, p=4, m=4, F=20, B=40) as the agents of its four ranks would keep it."""
    rec = recording.Recording()
    trace = tr.generate("1F1B", 4, 4, 20.0, 40.0, 0.02, iterations, seed=0)
    for s in range(4):
        rec.bubbles += [recording.RecordedBubble(s, s, b.slot, b.iteration, b.start_ns, b.end_ns, b.kind)
                        for b in tr.bubbles_of(trace[s], start_ns=10**12)]
        rec.trainers.append(recording.Declaration(s, s, s, "1F1B", 4, 4))
    return rec


@pytest.mark.parametrize(("schedule", "p", "m", "v", "fraction"), [
    ("1F1B", 4, 4, 1, 3 / 7), ("GPipe", 8, 32, 1, 7 / 39), ("Interleaved1F1B", 4, 8, 2, 3 / 19),
])
def test_theory_is_the_schedules_formula(schedule, p, m, v, fraction):
    assert analysis.theory(schedule, p, m, v).fraction == pytest.approx(fraction)


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "DualPipeV", "Mystery"])
def test_no_formula_is_said_where_none_applies(schedule):
    th = analysis.theory(schedule, 4, 8, 2)
    assert th.fraction is None and "none" in th.formula
    assert analysis.theory("", 0, 0).formula == "the trainer declared no schedule, p and m"


def test_slot_kinds_are_named_for_one_chunk_schedules_and_numbered_for_others():
    assert analysis.slot_kind("1F1B", trainer_pb2.BUBBLE_KIND_FILL, 0) == "fill"
    assert analysis.slot_kind("GPipe", trainer_pb2.BUBBLE_KIND_COOLDOWN, 3) == "drain gap"
    assert analysis.slot_kind("Interleaved1F1B", trainer_pb2.BUBBLE_KIND_FILL, 2) == "wait 3"
    assert analysis.slot_kind("", trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS, 5) == "between steps"


def test_the_anchor_traces_profile_has_the_bubbles_the_schedule_implies():
    stages = analysis.profile(anchor_recording(), [analysis.steps_for(5.0)])
    assert [s.rank for s in stages] == [0, 1, 2, 3]
    for s in stages:
        assert s.iteration_ms == pytest.approx(420.0, rel=0.03)  # m(F+B) + (p-1)(F+B)
        assert s.bubble_fraction == pytest.approx(3 / 7, abs=0.02)  # every stage idles (p-1)(F+B)
        assert s.theory.fraction == pytest.approx(3 / 7)
    one = stages[1]  # stage 1: fill 20, warm-up 80, two drain gaps of 20, drain 40 (DESIGN.md section 1)
    significant = [(sl.kind, round(sl.p50_ms)) for sl in one.slots if sl.p50_ms > 5]
    assert significant == [("fill", 20), ("warm-up→first backward", 80), ("drain gap", 20), ("drain gap", 20),
                           ("drain", 40)]
    assert sum(sl.share for sl in one.slots) == pytest.approx(one.bubble_fraction, rel=0.01)


def test_shorter_steps_harvest_more_and_a_step_longer_than_every_bubble_almost_nothing():
    bubbles = tr.bubbles_of(tr.generate("1F1B", 4, 4, 20.0, 40.0, 0.0, 10)[1])
    outs = [whatif.replay(bubbles, whatif.fixed_steps(ms * MS)) for ms in (1, 5, 20, 81)]
    shares = [o.share for o in outs]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0.9
    # As on the agent: a task is measured by running (its first steps overrun), then fits no bubble.
    assert shares[-1] < 0.1 and outs[-1].overrun_steps >= 1


def test_what_if_follows_the_agents_rules_exactly_on_a_hand_made_trace():
    """One slot of 50 ms every 100 ms, 10 ms steps: the predictor learns it in two iterations (the first is
    skipped), then each window runs until + margin: 50 ms - 0.2 ms margin - 0.15 ms wake-up = 4 steps."""
    bubbles = [whatif.Bubble(0, i, i * 100 * MS, i * 100 * MS + 50 * MS) for i in range(6)]
    out = whatif.replay(bubbles, whatif.fixed_steps(10 * MS))
    assert (out.iterations, out.bubble_ns) == (4, 4 * 50 * MS)
    assert (out.steps, out.harvested_ns, out.overrun_steps) == (16, 16 * 10 * MS, 0)
    assert out.share == pytest.approx(0.8)


def test_a_grant_latency_stream_is_taken_one_per_grant():
    """The same hand-made trace; grants that wake the worker 10.5 ms late leave room for 3 steps of 10 ms
    (50 - 0.2 margin - 10.5 = 39.3 ms), and a stream alternating 0.15 and 10.5 ms gives 4 and 3."""
    bubbles = [whatif.Bubble(0, i, i * 100 * MS, i * 100 * MS + 50 * MS) for i in range(6)]
    slow = whatif.replay(bubbles, whatif.fixed_steps(10 * MS), grant_latency_ns=10_500_000)
    assert (slow.steps, slow.overrun_steps) == (4 * 3, 0)
    mixed = whatif.replay(bubbles, whatif.fixed_steps(10 * MS), grant_latency_ns=iter([150_000, 10_500_000] * 2))
    assert (mixed.steps, mixed.overrun_steps) == (2 * (4 + 3), 0) and mixed.iterations == 4


def test_between_steps_waits_are_never_harvested():
    between = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS
    bubbles = [whatif.Bubble(0, i, i * 100 * MS, i * 100 * MS + 50 * MS, between) for i in range(6)]
    out = whatif.replay(bubbles, whatif.fixed_steps(MS))
    assert out.bubble_ns == 0 and out.steps == 0


def test_a_tasks_measured_steps_are_replayed_as_drawn(tmp_path: Path):
    rec = anchor_recording(10)
    rec.task_steps["7"] = [4 * MS, 5 * MS, 6 * MS]
    label, median_ms, source = analysis.task_steps("7", rec.task_steps["7"])
    assert (label, median_ms) == ("task 7", 5.0)
    (stage, *_) = analysis.profile(rec, [(label, median_ms, source)])
    assert 0.5 < stage.whatif[0].share < 1.0


def test_too_few_iterations_give_no_what_if_and_say_why():
    (stage, *_) = analysis.profile(anchor_recording(2), [analysis.steps_for(5.0)])
    assert stage.whatif == [] and "needs more than 2 iterations" in stage.whatif_note


def test_a_recording_round_trips(tmp_path: Path):
    rec = anchor_recording(4)
    rec.task_steps["3"] = [MS, 2 * MS]
    recording.save(tmp_path / "r.json", rec)
    back = recording.load(tmp_path / "r.json")
    assert back == rec
    assert analysis.profile(back, [analysis.steps_for(5.0)]) == analysis.profile(rec, [analysis.steps_for(5.0)])


def test_an_iteration_is_the_period_per_iteration_when_only_some_steps_were_timed():
    """A quiet agent's CPU stage times one step in a few (freeride.trainer.waits): iterations 0, 5, 10, 12 of a
    20 ms step, each with a 4 ms wait at its start and one at 10 ms."""
    timed = [0, 5, 10, 12]
    bubbles = [recording.RecordedBubble(0, 0, slot, it, it * 20 * MS + at, it * 20 * MS + at + 4 * MS, 0)
               for it in timed for slot, at in ((0, 0), (1, 10 * MS))]
    assert analysis.iteration_ns(bubbles) == pytest.approx(20 * MS)
    rec = recording.Recording(bubbles=bubbles)
    [stage] = analysis.profile(rec)
    assert stage.iterations == 4 and stage.iteration_ms == pytest.approx(20.0)
    assert stage.bubble_fraction == pytest.approx(8 / 20)


def _recording_doc(**over: object) -> dict:
    doc = {"format": recording.FORMAT, "version": recording.VERSION, "trainers": [], "task_steps": {},
           "bubbles": [{"gpu": 0, "rank": 0, "slot": 0, "iteration": 1, "start_ns": 10, "end_ns": 20, "kind": 0}]}
    return {**doc, **over}


def test_a_recording_larger_than_the_cap_is_refused_without_reading_it_all(tmp_path: Path):
    """`--from /dev/zero` read forever: the file is read up to the cap and refused past it, naming both."""
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(ValueError, match=r"big\.json.*larger than 1\.0 KiB") as err:
        recording.load(big, max_bytes=1024)
    assert "--record" in str(err.value)
    with pytest.raises(ValueError, match="/dev/zero"):
        recording.load(Path("/dev/zero"), max_bytes=1 << 20)  # endless: refused at the cap


def test_a_deeply_nested_recording_is_a_value_error_not_a_recursion_error(tmp_path: Path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=r"deep\.json.*nested too deeply"):
        recording.load(deep)


@pytest.mark.parametrize(("over", "words"), [
    ({"bubbles": [{"gpu": 0, "rank": 0, "slot": 0, "iteration": 1, "start_ns": 20, "end_ns": 10, "kind": 0}]},
     "ends before it starts"),
    ({"task_steps": {"3": [5, -1]}}, "negative step duration"),
    ({"bubbles": [{"gpu": 0, "rank": 0, "slot": 0, "iteration": 1, "start_ns": "x", "end_ns": 10, "kind": 0}]},
     "start_ns"),
])
def test_a_recording_with_impossible_durations_is_refused(tmp_path: Path, over: dict, words: str):
    """A bubble that ends before it starts showed as `idle -38.9% measured`."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_recording_doc(**over)))
    with pytest.raises(ValueError, match=words):
        recording.load(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_recording_doc()))
    assert len(recording.load(good).bubbles) == 1

"""The timeline picture's data: lanes from an agent's Timeline answer, labels, ranges; and its file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from freeride.tooling import plot
from freeride.v1 import tasks_pb2

MS = 1_000_000


def _task(task_id: str, name: str = "", ref: str = "pkg.mod:Thing") -> tasks_pb2.TaskInfo:
    return tasks_pb2.TaskInfo(id=task_id, spec=tasks_pb2.TaskSpec(name=name, ref=ref))


def _answer() -> tasks_pb2.TimelineResponse:
    steps = [tasks_pb2.StepSpan(start_ns=a * MS, duration_ns=2 * MS) for a in (11, 14)]
    share = tasks_pb2.WindowShare(task_id="t1", steps=2, step_spans=steps)
    window = tasks_pb2.WindowRecord(bubble_start_ns=10 * MS, bubble_end_ns=20 * MS, until_ns=19 * MS, shares=[share])
    bubbles = [tasks_pb2.BubbleSpan(start_ns=a * MS, end_ns=b * MS) for a, b in ((0, 5), (10, 20))]
    return tasks_pb2.TimelineResponse(gpu=3, bubbles=bubbles, windows=[window], tasks=[_task("t1", "resnet")])


def test_labels_are_names_or_classes_with_the_id_where_names_repeat() -> None:
    labels = plot.task_labels([_task("a", "resnet"), _task("b", "resnet"), _task("c", ref="sidetasks.x:PageRank")])
    assert labels == {"a": "resnet (a)", "b": "resnet (b)", "c": "PageRank"}


def test_an_agents_answer_becomes_one_lane_with_its_bubbles_windows_and_steps() -> None:
    (lane,) = plot.lanes_from_timeline(_answer())
    assert lane.label == "GPU 3"
    assert lane.bubbles == [(0, 5 * MS), (10 * MS, 20 * MS)]
    assert lane.windows == [(10 * MS, 19 * MS)]
    assert lane.steps == {"resnet": [(11 * MS, 13 * MS), (14 * MS, 16 * MS)]}
    assert lane.compute is None  # the agent does not know where training computed


def test_the_range_ends_at_the_last_side_task_step() -> None:
    lanes = plot.lanes_from_timeline(_answer())
    assert plot.busiest_range(lanes, 10 * MS) == (6 * MS, 16 * MS)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    lanes = plot.lanes_from_timeline(_answer())
    out = plot.plot(lanes, tmp_path / "sub" / "t.png", 0, 20 * MS, "a title", marks=[(10 * MS, "iteration 1")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_plotting_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(plot.PlotUnavailableError, match="pip install"):
        plot.plot(plot.lanes_from_timeline(_answer()), tmp_path / "t.png", 0, 20 * MS, "t")

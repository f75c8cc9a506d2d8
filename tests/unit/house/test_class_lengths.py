"""No class in freeride spans more than 300 lines (issues 24 and 34): a class that grows past it is cut along its
seams. The generated protobuf code (freeride/v1) is not ours to cut."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

PACKAGE = REPO / "freeride"
GENERATED = PACKAGE / "v1"
MAX_CLASS_LINES = 300


def class_lengths(root: Path, skip: Path | None = None) -> dict[str, int]:
    """Each class under `root` (path:name) -> the lines it spans, decorators excluded; nothing under `skip`."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        if skip is not None and path.is_relative_to(skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lengths[f"{path.relative_to(root.parent)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return lengths


def test_the_measure_sees_every_wings_classes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("class A:\n    x = 1\n\n    def f(self) -> None:\n        pass\n\n\nclass B: ...\n")
    assert class_lengths(tmp_path) == {f"{tmp_path.name}/m.py:A": 5, f"{tmp_path.name}/m.py:B": 1}
    every = class_lengths(PACKAGE, skip=GENERATED)
    assert {"freeride/agent/engine/supervisor.py:Supervisor", "freeride/agent/control/scheduler.py:Scheduler",
            "freeride/agent/engine/front.py:Agent", "freeride/agent/engine/trainers.py:Trainers",
            "freeride/worker/gate.py:StepGate", "freeride/trainer/reporter.py:BubbleReporter",
            "freeride/sdk/pool.py:PoolTask"} <= set(every)
    assert not any(name.startswith("freeride/v1/") for name in every)


def test_no_class_in_freeride_is_over_300_lines() -> None:
    over = {name: n for name, n in class_lengths(PACKAGE, skip=GENERATED).items() if n > MAX_CLASS_LINES}
    assert not over, f"classes over {MAX_CLASS_LINES} lines (cut them along their seams): {over}"

"""No class in the agent spans more than 300 lines (issue 24): a class that grows past it is cut along its seams."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "freeride" / "agent"
MAX_CLASS_LINES = 300


def class_lengths(root: Path) -> dict[str, int]:
    """Each class under `root` (path:name) -> the lines it spans, decorators excluded."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lengths[f"{path.relative_to(root.parent)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return lengths


def test_the_measure_sees_the_agents_classes(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("class A:\n    x = 1\n\n    def f(self) -> None:\n        pass\n\n\nclass B: ...\n")
    assert class_lengths(tmp_path) == {f"{tmp_path.name}/m.py:A": 5, f"{tmp_path.name}/m.py:B": 1}
    assert {"agent/engine/supervisor.py:Supervisor", "agent/control/scheduler.py:Scheduler",
            "agent/engine/front.py:Agent", "agent/engine/trainers.py:Trainers"} <= set(class_lengths(AGENT))


def test_no_class_in_the_agent_is_over_300_lines() -> None:
    over = {name: n for name, n in class_lengths(AGENT).items() if n > MAX_CLASS_LINES}
    assert not over, f"classes over {MAX_CLASS_LINES} lines (cut them along their seams): {over}"

"""Where things are, however deep the test that asks: the repository, the tests, the tests' own task files."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TASK_FILES = TESTS / "tasks"  # the side tasks the tests submit (behaviours.py, lifecycle.py, ...)

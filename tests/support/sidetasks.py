"""Drive a side task in-process the way the worker does: context, setup, steps, checkpoint round trips."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, TypeVar

from freeride import IterativeTask, TaskContext
from freeride.client import AgentClient
from freeride.tooling.harness import wait_for_info
from freeride.v1 import tasks_pb2

T = TypeVar("T", bound=IterativeTask)


class Window:
    """Stands in for the worker's window gate: a bubble with a fixed number of seconds left."""

    def __init__(self, remaining_s: float) -> None:
        self.remaining = remaining_s

    def remaining_s(self) -> float:
        return self.remaining

    def yield_point(self) -> None:
        pass


def started(task: T, checkpoint_dir: Path, window_s: float = 0.0) -> T:
    """Give the task the context the worker would (no window: every step is one unit) and set it up."""
    runtime = Window(window_s) if window_s > 0 else None
    task.context = TaskContext(task_id="1", checkpoint_path=str(checkpoint_dir / "task-1.ckpt"), _runtime=runtime)
    task.setup()
    return task


def checkpoint(task: IterativeTask) -> bytes:
    """What the worker writes to disk: the pickled state_dict."""
    state = task.state_dict()
    assert state is not None, "the task must be resumable"
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def resumed(task: T, saved: bytes, checkpoint_dir: Path, window_s: float = 0.0) -> T:
    """A fresh instance of the task (a new worker process) restored from a checkpoint."""
    started(task, checkpoint_dir, window_s)
    task.load_state_dict(pickle.loads(saved))
    return task


def run(task: IterativeTask, steps: int | None = None) -> int:
    """Run `steps` steps, or until done; returns the steps run."""
    n = 0
    while not task.is_done() and (steps is None or n < steps):
        task.step()
        n += 1
    return n


def progress(task: IterativeTask) -> dict[str, Any]:
    return dict(task.progress())


def wait_for_checkpointed(client: AgentClient, task_id: str, key: str, at_least: float, timeout_s: float = 60.0
                          ) -> tasks_pb2.TaskInfo:
    """Block, woken by each window the agent accounts, until the task has checkpointed and its progress
    `key` is at least `at_least` (a real agent's task, for the kill -9 tests)."""
    return wait_for_info(client, task_id, lambda i: i.checkpoint_steps > 0 and i.progress.get(key, 0) >= at_least,
                         timeout_s, at_windows=True)


WORDS = ["def", "class", "import", "return", "while", "lambda", "yield", "with"]


def write_prompts(path: Path, n: int) -> Path:
    """n prompts of different lengths (1 to 24 bytes), so that rows join and leave at different units."""
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "prompt": " ".join(WORDS[j % 8] for j in range(i % 5 + 1))[:24]}))
            f.write("\n")
    return path

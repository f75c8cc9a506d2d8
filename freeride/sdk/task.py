"""The two ways to write a side task: iterative (the framework calls step) and imperative."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


class _Runtime(Protocol):
    def remaining_s(self) -> float: ...
    def yield_point(self) -> None: ...


@dataclass
class TaskContext:
    """What a running task may know about where it runs."""

    task_id: str
    checkpoint_path: str
    device: str = "cpu"
    mem_limit_bytes: int = 0
    gpu: int = -1  # the index of the agent's GPU (`freeride agent --gpu N`); -1: not run by an agent
    _runtime: _Runtime | None = field(default=None, repr=False)

    def remaining_s(self) -> float:
        """Seconds left in the current bubble window (0 outside one); lets a step size itself."""
        return self._runtime.remaining_s() if self._runtime is not None else 0.0


class _TaskBase:
    """Shared by both task kinds: declared resources and optional checkpoint hooks."""

    #: Memory cap the task needs (bytes); 0 means undeclared. `freeride submit --mem` overrides it.
    mem_limit_bytes: ClassVar[int] = 0
    #: Default priority (0..100, higher first); `freeride submit --priority` overrides it.
    priority: ClassVar[int] = 0

    context: TaskContext

    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        """Refuse bad arguments at submit, before the task is stored or any worker starts.

        Runs in the throwaway reference-check process at `freeride submit`, with the constructor
        arguments given, as converted (those not given are absent). Raise ValueError with a
        one-line message to refuse the submission: `freeride submit` prints it and exits 2.
        """

    def setup(self) -> None:
        """Load data and build state; runs once per worker process, before any window."""

    def state_dict(self) -> Mapping[str, Any] | None:
        """State to checkpoint (picklable); None means the task cannot resume mid-way."""
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict returned; called after setup() when resuming."""

    def progress(self) -> Mapping[str, float]:
        """Numbers that show how far the task got (loss, accuracy, items done)."""
        return {}

    def teardown(self) -> None:
        """Release resources; runs when the worker stops for any reason it can handle."""

    def available(self) -> bool:
        """Called by the worker while the task waits after raising Unavailable (between backoffs).

        Return True when the resource is back (e.g. a PING answered); the task then gets windows
        again. An exception counts as False. It runs outside any window: keep it light, off the GPU.
        """
        return True


class IterativeTask(_TaskBase):
    """A task made of short steps; freeride runs `step()` only when it fits the open bubble."""

    def step(self) -> None:
        """One bounded piece of work. Keep it shorter than the bubbles you want to use.

        Raise freeride.Unavailable when a resource it needs is down: the step does not count, and
        the task waits, holding no window, until `available()` says the resource is back.
        """
        raise NotImplementedError

    def is_done(self) -> bool:
        """True when the task has finished its work."""
        return False

    def min_step_s(self) -> float | None:
        """For a task whose steps fit themselves to the window (as many units as `context.remaining_s()`
        allows, at least one): how long its smallest step, one unit, takes, in seconds.

        None (the default): freeride judges whether a step fits from the measured step times (a high
        percentile). A task that sizes its steps must say this instead: its steps grow with the windows
        it gets, and judged by them it would no longer fit the short bubbles (on a loaded host, not even
        the long ones) although one unit does.
        """
        return None


class ImperativeTask(_TaskBase):
    """A task written as a plain loop that calls `self.yield_point()` between pieces of work."""

    def run(self) -> None:
        """The whole task. Returning means it is done."""
        raise NotImplementedError

    def yield_point(self) -> None:
        """Mark the end of one piece of work; returns when the next piece may run.

        Raises TaskStop (a BaseException) when the task must stop; let it propagate.
        """
        runtime = self.context._runtime
        if runtime is not None:
            runtime.yield_point()

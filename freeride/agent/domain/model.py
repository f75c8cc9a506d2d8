"""Domain objects of the agent: task states, specs, records and counters (no protobuf here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from freeride.errors import InvalidStateError


class TaskState(enum.Enum):
    SUBMITTED = "SUBMITTED"
    STARTING = "STARTING"
    READY = "READY"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """A worker process exists (or is being started) for the task."""
        return self in (TaskState.STARTING, TaskState.READY, TaskState.RUNNING)


TERMINAL = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})

_ALLOWED: dict[TaskState, frozenset[TaskState]] = {
    TaskState.SUBMITTED: frozenset({TaskState.STARTING, TaskState.PAUSED, TaskState.CANCELLED, TaskState.FAILED}),
    TaskState.STARTING: frozenset(
        {TaskState.READY, TaskState.STARTING, TaskState.PAUSED, TaskState.CANCELLED, TaskState.FAILED,
         TaskState.DONE}
    ),
    TaskState.READY: frozenset(
        {TaskState.RUNNING, TaskState.STARTING, TaskState.PAUSED, TaskState.DONE, TaskState.FAILED,
         TaskState.CANCELLED}
    ),
    TaskState.RUNNING: frozenset(
        {TaskState.READY, TaskState.STARTING, TaskState.PAUSED, TaskState.DONE, TaskState.FAILED,
         TaskState.CANCELLED}
    ),
    TaskState.PAUSED: frozenset({TaskState.SUBMITTED, TaskState.CANCELLED}),
    TaskState.DONE: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}


def check_transition(current: TaskState, new: TaskState) -> None:
    """Raise InvalidStateError unless the state machine allows current -> new."""
    if new not in _ALLOWED[current]:
        raise InvalidStateError(f"task is {current.value}; it cannot become {new.value}")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    ref: str
    args: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    mem_limit_bytes: int = 0
    max_restarts: int = -1
    checkpoint_interval_s: float = 0.0
    no_mps: bool = False  # run time-sliced, outside MPS: a GPU fault in an MPS client reaches all clients
    python: str = ""  # the interpreter its check and workers run in (absolute, pinned at submit); "": the agent's


@dataclass
class Counters:
    """Harvest ledger of one task or one GPU; times in nanoseconds."""

    steps: int = 0
    harvested_ns: int = 0
    overrun_ns: int = 0
    overrun_steps: int = 0
    windows: int = 0
    killed_steps: int = 0
    bubbles: int = 0
    bubble_ns: int = 0
    events: int = 0
    training_ns: int = 0  # the GPU's alone: time with a trainer stream open (freeride.agent.control.training)

    def add(self, other: Counters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class TaskRecord:
    id: str
    spec: TaskSpec
    state: TaskState
    kind: str = "iterative"
    reason: str = ""
    restarts: int = 0
    created_unix_s: float = 0.0
    updated_unix_s: float = 0.0
    counters: Counters = field(default_factory=Counters)
    progress: dict[str, float] = field(default_factory=dict)
    checkpoint_steps: int = 0
    step_estimate_ns: int = 0
    peak_memory_bytes: int = 0

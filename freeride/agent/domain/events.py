"""What flows through the agent's engine, in domain terms: bubble edges and worker messages in,
accounted windows and live-view events out.

No protobuf here: the servicers convert at the edge (freeride.agent.edge.convert), so the scheduler,
the supervisor and the task table never see a message class. The bubble edge is on the hot path:
it is a NamedTuple, one cheap construction per edge.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from freeride.agent.domain.model import TaskRecord


# -- from trainers ---------------------------------------------------------------------------------
class Edge(NamedTuple):
    """One bubble edge reported by a training rank (already checked at the edge: limits.edge_ok)."""

    start: bool  # True: the GPU is idle from time_ns (START); False: it is needed again (END)
    harvestable: bool  # False for a wait between schedule steps: reported and counted, never harvested
    rank: int
    slot: int
    iteration: int
    time_ns: int
    expected_duration_ns: int = 0  # hint; 0: not given
    free_memory_bytes: int = 0  # hint; 0: not given
    kind: int = 0  # the trainer's freeride.v1.BubbleKind (fill, warm-up, drain, cool-down); 0: not said
    stands_for: int = 1  # iterations its step stands for: >1 when a quiet trainer timed only some (ring only)


# -- from workers ----------------------------------------------------------------------------------
class Ready(NamedTuple):
    """setup() and any checkpoint restore are done; the worker may be granted windows."""

    kind: str
    resumed_steps: int
    progress: dict[str, float]


class Steps(NamedTuple):
    """Steps a worker ran in one window: (start_ns, duration_ns) each."""

    window_id: int
    steps: list[tuple[int, int]]
    progress: dict[str, float]
    peak_memory_bytes: int


class WindowDone(NamedTuple):
    """The worker runs nothing more in this window."""

    window_id: int
    idle_since_ns: int  # the worker's CLOCK_MONOTONIC when it went idle (an instant, not a duration)
    step_estimate_ns: int  # 0: no estimate
    woke_ns: int = 0  # the worker's CLOCK_MONOTONIC when it saw the grant; 0: unknown


class Checkpointed(NamedTuple):
    steps: int
    progress: dict[str, float]


class Finished(NamedTuple):
    progress: dict[str, float]


class Failed(NamedTuple):
    reason: str
    retryable: bool


class Waiting(NamedTuple):
    """The task raised Unavailable (waiting=True): it wants no window until the resource is back (False)."""

    reason: str  # the task's own words: what is down
    waiting: bool


class Checkpointing(NamedTuple):
    """The worker began (active=True) or ended (False) a checkpoint, whoever asked for it: no step, no window."""

    active: bool


class IdleCpu(NamedTuple):
    """The task used CPU while its worker held no window: cpu_ns in idle_ns of waiting (once per worker)."""

    cpu_ns: int
    idle_ns: int


WorkerMessage = Ready | Steps | WindowDone | Checkpointed | Finished | Failed | Waiting | Checkpointing | IdleCpu


# -- to workers ------------------------------------------------------------------------------------
class Control(enum.Enum):
    """What the agent asks of an attached worker (pause, cancel: checkpoint, then exit; checkpoint: and go on)."""

    PAUSE = "pause"
    CANCEL = "cancel"
    CHECKPOINT = "checkpoint"  # (sent to a worker waiting for a full disk once space was freed: try now)


class WorkerSetup(NamedTuple):
    """The answer to a worker's hello: what to run and where its checkpoint is (its window word it
    inherited at spawn)."""

    task_ref: str
    args: dict[str, str]
    checkpoint_path: str
    checkpoint_interval_s: float
    mem_limit_bytes: int


# -- accounted history -----------------------------------------------------------------------------
class Share(NamedTuple):
    """One task's part of an accounted window."""

    task_id: str
    first_step_ns: int
    idle_since_ns: int  # when it reported WindowDone (0: it never did; its worker went away)
    steps: int
    busy_ns: int
    overrun_ns: int
    step_spans: Sequence[tuple[int, int]] = ()  # each step: filled in history answers only
    granted_ns: int = 0  # when the agent wrote the grant (0: not recorded)
    woke_ns: int = 0  # when the worker saw it (0: not recorded)


class WindowRecord(NamedTuple):
    """A bubble window, closed and accounted."""

    window_id: int
    rank: int
    slot: int
    iteration: int
    bubble_start_ns: int
    bubble_end_ns: int
    until_ns: int
    predicted_ns: int
    shares: tuple[Share, ...]
    seen_ns: int = 0  # when the agent took the START edge (0: not recorded)


class BubbleSpan(NamedTuple):
    """One bubble as the agent saw it (START and END both received)."""

    rank: int
    slot: int
    iteration: int
    start_ns: int
    end_ns: int
    predicted_ns: int  # 0: no prediction yet (the slot was still being learned)
    kind: int = 0  # the trainer's freeride.v1.BubbleKind; 0: not said


class TrainerDeclaration(NamedTuple):
    """What a training rank said of its pipeline in its hello (freeride.trainer.Pipeline)."""

    rank: int
    stage: int
    schedule: str  # "": not declared
    stages: int  # p; 0: not declared
    microbatches: int  # m; 0: not declared
    stages_per_rank: int  # v; 0 or 1: one


# -- to watchers -----------------------------------------------------------------------------------
class TaskView(NamedTuple):
    """A task as clients see it: its record and what exists of it only while its worker lives."""

    record: TaskRecord
    running: bool  # it holds a window now (shown as RUNNING)
    pid: int  # 0: no worker
    memory_bytes: int  # at the watchdog's latest sample; 0: no worker
    log_path: str = ""  # where its output is stored ("" when the agent keeps no task logs)


class TaskChanged(NamedTuple):
    time_ns: int
    task: TaskView  # a copy taken when it changed


class WindowAccounted(NamedTuple):
    time_ns: int
    record: WindowRecord


class TrainerChanged(NamedTuple):
    time_ns: int
    connected: bool
    peer: str
    trainers: int  # trainer streams open now
    path: str = "grpc"  # the road this stream's edges take: "shm" (ring) or "grpc"


AgentEvent = TaskChanged | WindowAccounted | TrainerChanged

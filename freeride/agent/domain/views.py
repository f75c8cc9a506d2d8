"""The agent's answers to Stats and Timeline, in domain terms (convert.py makes the messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

from freeride.agent.domain.events import BubbleSpan, TaskView, TrainerDeclaration, WindowRecord
from freeride.agent.domain.trainers import TrainerStream
from freeride.gpu.control import GpuSnapshot


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """Memory on the agent's GPU and who holds it. In CPU mode (or when the query failed) only the
    side-task figures are known: `device` is None."""

    mode: str  # cpu | nvml | fake
    mps: str  # off | started | existing | unavailable
    side_tasks_used_bytes: int  # the workers' memory now
    side_tasks_reserved_bytes: int  # sum of the caps of admitted tasks
    usable_bytes: int | None  # admission budget for side tasks in all (None: unbounded)
    headroom_bytes: int
    waiting_tasks: int  # tasks that wait for memory
    device: GpuSnapshot | None = None  # the device now: name, totals, the trainer's share
    trainer_peak_bytes: int = 0  # total minus the trainer's free-memory hint (0: no hint)


@dataclass(frozen=True, slots=True)
class GpuStats:
    """The GPU's harvest ledger and the agent's own health figures."""

    gpu: int
    bubbles: int
    bubble_ns: int
    harvested_ns: int
    overrun_ns: int
    overrun_steps: int
    steps: int
    windows: int
    windows_granted: int
    events: int
    prediction_error_p50: float
    uptime_ns: int
    dropped_events: int
    rejected_events: int
    trainer_free_memory_bytes: int
    trainers: int
    event_delay_ns_p50: float
    event_delay_ns_p99: float
    memory: GpuMemory
    training_ns: int = 0  # time with a trainer stream open, from the ledger
    trainer_streams: tuple[TrainerStream, ...] = ()  # copies, one per stream open now


@dataclass(frozen=True, slots=True)
class Stats:
    gpu: GpuStats
    tasks: list[TaskView]


@dataclass(frozen=True, slots=True)
class History:
    """The agent's recent bubbles and accounted windows (what the Timeline RPC answers)."""

    gpu: int
    now_ns: int  # the agent's CLOCK_MONOTONIC when it answered
    bubbles: list[BubbleSpan]
    windows: list[WindowRecord]
    tasks: list[TaskView]  # the tasks the windows name
    trainers: list[TrainerDeclaration] = field(default_factory=list)  # each rank's last hello

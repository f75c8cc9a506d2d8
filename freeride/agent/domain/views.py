"""The agent's answers to Stats and Timeline, in domain terms (convert.py makes the messages)."""

from __future__ import annotations

from dataclasses import dataclass, field

from freeride.agent.domain.events import BubbleSpan, TaskView, TrainerDeclaration, WindowRecord
from freeride.agent.domain.trainers import TrainerStream
from freeride.gpu.control import GpuSnapshot


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """Memory on the agent's GPU and who holds it. In CPU mode (or when the query failed) only the
    side-task figures are known: `device` is None. The defaults: a CPU agent with no task."""

    mode: str = "cpu"  # cpu | nvml | fake
    mps: str = "off"  # off | started | existing | unavailable
    side_tasks_used_bytes: int = 0  # the workers' memory now
    side_tasks_reserved_bytes: int = 0  # sum of the caps of admitted tasks
    usable_bytes: int | None = None  # admission budget for side tasks in all (None: unbounded)
    headroom_bytes: int = 0
    waiting_tasks: int = 0  # tasks that wait for memory
    device: GpuSnapshot | None = None  # the device now: name, totals, the trainer's share
    trainer_peak_bytes: int = 0  # total minus the trainer's free-memory hint (0: no hint)


@dataclass(frozen=True, slots=True)
class GpuStats:
    """The GPU's harvest ledger and the agent's own health figures (the defaults: nothing seen yet)."""

    gpu: int = 0
    bubbles: int = 0
    bubble_ns: int = 0
    harvested_ns: int = 0
    overrun_ns: int = 0
    overrun_steps: int = 0
    steps: int = 0
    windows: int = 0
    windows_granted: int = 0
    events: int = 0
    prediction_error_p50: float = 0.0
    uptime_ns: int = 0
    dropped_events: int = 0
    rejected_events: int = 0
    trainer_free_memory_bytes: int = 0
    trainers: int = 0
    event_delay_ns_p50: float = 0.0
    event_delay_ns_p99: float = 0.0
    memory: GpuMemory = field(default_factory=GpuMemory)
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

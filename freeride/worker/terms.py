"""The worker's own words for what crosses its stream to the agent, free of protobuf: what the agent asks
(`Control`), the task it sends (`Setup`), and why a window ended (`EndReason`). freeride.worker.messages
translates them to and from freeride.v1; the gate, the checkpoint file and the process speak only these.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Control(enum.Enum):
    """What the agent asked for last (the reader thread sets it; the main thread acts on it)."""

    NONE = "none"
    PAUSE = "pause"  # checkpoint, then exit
    CANCEL = "cancel"  # checkpoint, then exit
    CHECKPOINT = "checkpoint"  # checkpoint and keep going


class EndReason(enum.Enum):
    """Why the worker ended a window (WindowDone)."""

    REVOKED = "revoked"  # the agent closed it (bubble END)
    EXPIRED = "expired"  # its predicted end passed
    NO_FIT = "no fit"  # the next step would not fit before its end
    DONE = "done"  # the task finished
    STOPPING = "stopping"  # pause or cancel asked
    UNAVAILABLE = "unavailable"  # the task raised Unavailable: it waits for a resource
    CHECKPOINT = "checkpoint"  # granted while the worker was idle, unseen, given back: it checkpoints now


@dataclass(frozen=True)
class Setup:
    """The task this worker runs, as the agent sent it."""

    task_ref: str
    args: Mapping[str, str] = field(default_factory=dict)
    checkpoint_path: str = ""
    checkpoint_interval_s: float = 0.0
    mem_limit_bytes: int = 0

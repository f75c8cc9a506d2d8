"""What a rank declares of its pipeline in its hello, for `freeride profile`'s theory (docs/profile.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    """What a rank declares of its pipeline in its hello, for `freeride profile`'s theory (docs/profile.md)."""

    schedule: str = ""  # the schedule's name: "1F1B", "GPipe", "Interleaved1F1B", ... ("": not declared)
    stages: int = 0  # p: ranks in the pipeline (0: not declared)
    microbatches: int = 0  # m: micro-batches per iteration (0: not declared)
    stages_per_rank: int = 1  # v: model chunks per rank (interleaved and V-shaped schedules)

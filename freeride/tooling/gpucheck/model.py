"""What a check is given (CheckContext), what it answers (Outcome) and what the report holds (CheckResult).

The runner writes a CheckContext as JSON for the check's child process; the child writes the
check's Outcome back as JSON. Both are plain data so that a check is a function of one argument.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
VERDICTS = (PASSED, FAILED, SKIPPED)

MPS_CONTROL = "nvidia-cuda-mps-control"
FAKE_GPU_SPEC = "name=Fake H100,total=80GiB"
# The environment mark every process a check starts inherits: what the runner sweeps once the check ends.
MARK_ENV = "FREERIDE_GPUCHECK_MARK"


def stand_in_mps_control() -> str:
    """The stand-in control program (freeride.gpu's), as an --mps-control value."""
    return f"{sys.executable} -m freeride.gpu._fake_mps_control"


@dataclass(frozen=True)
class CheckContext:
    """What a check knows about its run: written by the runner, read by the check's child process."""

    check: str
    fake: bool  # --fake-gpu: the fake GPU and the stand-in MPS control program, never the real one
    gpu: int  # --gpu N
    cuda: bool  # torch sees a CUDA device (always False in a --fake-gpu run)
    deadline_monotonic: float  # CLOCK_MONOTONIC (one clock for every process of the host): the budget's end
    work_dir: str  # a private, short directory (unix socket paths must stay under 108 bytes), removed afterwards

    def left_s(self, margin_s: float = 0.0) -> float:
        """Seconds left of this check's budget, less `margin_s` (never below 1: a subprocess still gets a timeout)."""
        return max(1.0, self.deadline_monotonic - time.monotonic() - margin_s)

    @property
    def work(self) -> Path:
        return Path(self.work_dir)

    def mps_program(self) -> str | None:
        """The MPS control program this run may use: the stand-in in fake mode, else the real one if on PATH."""
        if self.fake:
            return stand_in_mps_control()
        return shutil.which(MPS_CONTROL)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> CheckContext:
        return cls(**json.loads(path.read_text()))


@dataclass
class Outcome:
    """A check's answer: its verdict, a one-line summary (the report's evidence column) and its details."""

    verdict: str
    summary: str = ""
    reason: str = ""  # why it failed or was skipped
    details: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), default=str))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Outcome:
        data = json.loads(path.read_text())
        if data.get("verdict") not in VERDICTS:
            raise ValueError(f"verdict {data.get('verdict')!r} is none of {', '.join(VERDICTS)}")
        return cls(**data)


def passed(summary: str, **details: Any) -> Outcome:
    return Outcome(PASSED, summary, "", details)


def failed(reason: str, summary: str = "", **details: Any) -> Outcome:
    return Outcome(FAILED, summary or reason, reason, details)


def skipped(reason: str, **details: Any) -> Outcome:
    return Outcome(SKIPPED, reason, reason, details)


@dataclass
class CheckResult:
    """One check in the report."""

    name: str
    verdict: str
    duration_s: float
    budget_s: float
    summary: str
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, outcome: Outcome, duration_s: float, budget_s: float) -> CheckResult:
        return cls(name, outcome.verdict, round(duration_s, 2), round(budget_s, 1), outcome.summary, outcome.reason,
                   outcome.details)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

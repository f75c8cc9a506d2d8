"""A task's checkpoint file: its format (a version-stamped pickle of the task's state, the steps run and the
step-time samples), written whole or not at all (a temporary file, fsync, rename), read back, and the errors of
both, each saying what to do. A full disk is no failure: the error carries the reason to wait with
(freeride.core.disk). The worker (freeride.worker.process) decides what a task's state is and when to write it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeride.core import disk
from freeride.core.private import create_private

VERSION = 1  # the file's format; `read` refuses any other


class CheckpointFormatError(Exception):
    """The checkpoint was written in a format this worker does not read, or its task says (PermanentError) that it
    cannot resume from it: a retry would read the same file."""


class CheckpointError(Exception):
    """Taking, writing or restoring the task's checkpoint failed; the message names the part (state_dict(), ...)."""

    def __init__(self, message: str, disk_full: str = "") -> None:
        super().__init__(message)
        self.disk_full = disk_full  # the disk is full: the reason to wait with (freeride.core.disk), not a failure


@dataclass(frozen=True)
class Checkpoint:
    steps: int  # steps the task had run
    state: Any  # what its state_dict() returned
    step_samples_ns: list[int] = field(default_factory=list)  # the step-time estimator's samples


def write(path: Path, checkpoint: Checkpoint) -> None:
    """Write `checkpoint` to `path` (private to this user), replacing the previous one only once it is whole."""
    payload = {"version": VERSION, "steps": checkpoint.steps, "state": checkpoint.state,
               "step_samples_ns": checkpoint.step_samples_ns}
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with os.fdopen(create_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a partial file: its space goes back (the previous checkpoint stays)
            tmp.unlink()
        # (checkpoints live in the state directory's checkpoints/: freeride.agent.engine.streams)
        full = disk.wait_reason("its checkpoint cannot be written to", path.parent, exc, path.parent.parent) \
            if disk.is_full(exc) else ""
        raise CheckpointError(f"writing the checkpoint {path} failed: {exc}", disk_full=full) from exc
    except Exception as exc:  # pickle's errors: PicklingError, TypeError, AttributeError
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointError(f"what state_dict() returned cannot be pickled: {type(exc).__name__}: {exc}") from exc


def read(path: Path) -> Checkpoint | None:
    """The checkpoint at `path`; None when there is none (a task's first start)."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        payload = pickle.load(f)
    version = payload.get("version") if isinstance(payload, dict) else None
    if version != VERSION:
        raise CheckpointFormatError(
            f"checkpoint {path} is in format {version!r}, and this freeride reads format {VERSION}; "
            "move the file away (it is kept) to start the task from scratch, or resume it with the freeride "
            "that wrote it"
        )
    assert isinstance(payload, dict)
    return Checkpoint(steps=int(payload["steps"]), state=payload["state"],
                      step_samples_ns=list(payload.get("step_samples_ns", [])))

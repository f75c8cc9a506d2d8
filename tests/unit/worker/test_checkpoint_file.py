"""The checkpoint file by itself (freeride.worker.checkpoint): round trip, format, private, whole or not at all."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest

from freeride.worker import checkpoint
from freeride.worker.checkpoint import Checkpoint, CheckpointError, CheckpointFormatError


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "task.ckpt"
    checkpoint.write(path, Checkpoint(steps=7, state={"w": [1, 2]}, step_samples_ns=[5, 6]))
    assert checkpoint.read(path) == Checkpoint(steps=7, state={"w": [1, 2]}, step_samples_ns=[5, 6])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the task's state is its owner's alone
    assert not path.with_suffix(".ckpt.tmp").exists()


def test_no_file_is_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.read(tmp_path / "none.ckpt") is None


@pytest.mark.parametrize("payload", [{"version": 99, "steps": 1, "state": {}}, ["not", "a", "dict"]])
def test_another_format_is_refused_saying_how_to_start_over(tmp_path: Path, payload: Any) -> None:
    path = tmp_path / "task.ckpt"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(CheckpointFormatError, match="move the file away"):
        checkpoint.read(path)
    assert path.exists()  # kept: the user's


def test_a_state_pickle_refuses_is_named_and_the_previous_checkpoint_stays(tmp_path: Path) -> None:
    path = tmp_path / "task.ckpt"
    checkpoint.write(path, Checkpoint(steps=1, state={"ok": 1}))
    with pytest.raises(CheckpointError, match="cannot be pickled") as caught:
        checkpoint.write(path, Checkpoint(steps=2, state={"lock": lambda: None}))
    assert not caught.value.disk_full
    assert checkpoint.read(path) == Checkpoint(steps=1, state={"ok": 1})
    assert not path.with_suffix(".ckpt.tmp").exists()


def test_a_full_disk_is_a_reason_to_wait_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoints" / "task.ckpt"
    path.parent.mkdir()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.write(path, Checkpoint(steps=1, state={}))
    assert caught.value.disk_full  # the reason the task waits with
    assert not path.exists() and not path.with_suffix(".ckpt.tmp").exists()

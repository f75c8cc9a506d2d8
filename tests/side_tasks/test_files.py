"""sidetasks.files: `publish` leaves a complete output or none, and `sweep` deletes what a writer killed mid-publish
left, never a live writer's file nor a file publish did not make. The writers are real processes, killed with
SIGKILL while they hold their temporary file."""

from __future__ import annotations

import os
import select
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidetasks import files
from sidetasks.files import publish, sweep


class Writer:
    """publish() in a forked process, stopped after its bytes are written and before its rename until `go()`."""

    def __init__(self, path: Path, data: bytes) -> None:
        started_r, started_w = os.pipe()
        self._go_r, self._go_w = os.pipe()
        self.code: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the writer
            code = 1
            try:
                real_fsync = os.fsync

                def fsync(fd: int) -> None:
                    real_fsync(fd)
                    if stat.S_ISREG(os.fstat(fd).st_mode):  # the temporary file's (then the folders')
                        os.write(started_w, b"x")
                        os.read(self._go_r, 1)

                os.fsync = fsync
                publish(path, data)
                code = 0
            finally:
                os._exit(code)
        os.close(started_w)
        os.close(self._go_r)
        ready, _, _ = select.select([started_r], [], [], 30)
        assert ready and os.read(started_r, 1) == b"x", "the writer never reached its rename"
        os.close(started_r)

    def go(self) -> int:
        """Let it rename; its exit code."""
        os.write(self._go_w, b"x")
        return self._reap()

    def kill(self) -> int:
        os.kill(self.pid, signal.SIGKILL)
        return self._reap()

    def _reap(self) -> int:
        self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.code

    def close(self) -> None:
        if self.code is None:
            self.kill()
        os.close(self._go_w)


@pytest.fixture
def writers() -> Iterator[Callable[[Path, bytes], Writer]]:
    started: list[Writer] = []

    def start(path: Path, data: bytes) -> Writer:
        started.append(Writer(path, data))
        return started[-1]

    yield start
    for writer in started:
        writer.close()


def _temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob(".*.tmp"))


def test_a_writer_killed_before_its_rename_leaves_a_temporary_file_that_sweep_deletes(
        tmp_path: Path, writers: Callable[[Path, bytes], Writer]) -> None:
    out = tmp_path / "out" / "a"
    assert writers(out / "q1.json", b"one\n").kill() == -signal.SIGKILL
    left = _temporaries(tmp_path)
    assert not (out / "q1.json").exists() and len(left) == 1  # nothing partial: one leftover
    assert [p.name for p in sweep(tmp_path / "out")] == left
    assert _temporaries(tmp_path) == []
    publish(out / "q1.json", b"one\n")  # the item processed again: the output whole
    assert (out / "q1.json").read_bytes() == b"one\n"


def test_sweep_keeps_a_live_writers_file_and_that_writer_publishes(
        tmp_path: Path, writers: Callable[[Path, bytes], Writer]) -> None:
    live = writers(tmp_path / "q2.json", b"two\n")
    [before] = _temporaries(tmp_path)
    assert sweep(tmp_path) == []
    assert _temporaries(tmp_path) == [before]
    assert live.go() == 0
    assert (tmp_path / "q2.json").read_bytes() == b"two\n" and _temporaries(tmp_path) == []


def test_sweep_touches_only_the_names_publish_makes(tmp_path: Path) -> None:
    theirs = [".notes.tmp", "q3.json.0123456789ab.tmp", ".q3.json.0123456789AB.tmp", ".q3.json.0123.tmp",
              ".q3.json.0123456789ab.tmp.bak"]
    for name in theirs:
        (tmp_path / name).write_bytes(b"the user's")
    assert sweep(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)


def test_a_file_swept_between_its_creation_and_its_lock_is_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = files._create_locked
    calls = []

    def swept_first(path: Path) -> tuple[int, Path]:
        fd, tmp = real(path)
        calls.append(tmp)
        if len(calls) == 1:
            os.unlink(tmp)  # what a sweep does when it opened the file before this writer locked it
        return fd, tmp

    monkeypatch.setattr(files, "_create_locked", swept_first)
    publish(tmp_path / "q4.json", b"four\n")
    assert len(calls) == 2 and calls[0] != calls[1]
    assert (tmp_path / "q4.json").read_bytes() == b"four\n" and _temporaries(tmp_path) == []


def test_an_output_folder_removed_under_the_writer_is_its_error_not_a_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = files._create_locked

    def folder_gone(path: Path) -> tuple[int, Path]:
        fd, tmp = real(path)
        os.unlink(tmp)
        os.rmdir(path.parent)
        return fd, tmp

    monkeypatch.setattr(files, "_create_locked", folder_gone)
    with pytest.raises(FileNotFoundError):
        publish(tmp_path / "gone" / "q5.json", b"five\n")

"""The window word (freeride.core.window): only the agent's mapping writes it, only its worker holds it."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from freeride.core.window import SIZE, WindowReader, WindowWord, WindowWriter


@pytest.fixture
def writer() -> Iterator[WindowWriter]:
    w = WindowWriter()
    try:
        yield w
    finally:
        w.close_child_end()
        w.close()


def test_a_grant_and_a_revocation_reach_the_reader_with_a_wake_up(writer: WindowWriter) -> None:
    reader = WindowReader(*writer.child_fds())
    writer.grant(7, 123_456)
    assert reader.read() == WindowWord(7, 123_456, True)
    assert reader.drain()
    writer.revoke(7, 123_456)
    assert reader.read() == WindowWord(7, 123_456, False)


def test_the_word_is_sealed_against_every_writer_but_the_agents_own_mapping(writer: WindowWriter) -> None:
    word_fd, _ = writer.child_fds()
    with pytest.raises(PermissionError):
        mmap.mmap(word_fd, SIZE)  # a shared writable mapping, as a task with the worker's descriptor would try
    with pytest.raises(PermissionError):
        os.pwrite(word_fd, b"\1" * 8, 8)
    # Reopened through /proc, as another process of the same user would reach a worker's descriptor.
    fd = os.open(f"/proc/self/fd/{word_fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\1" * 8, 8)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, SIZE)
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)  # nor shrunk under the agent's mapping (SIGBUS in the agent)
    finally:
        os.close(fd)
    writer.grant(1, 5)  # the agent's mapping, made before the seal, still writes
    assert WindowReader(*writer.child_fds()).read() == WindowWord(1, 5, True)


def test_the_word_and_the_pipe_reach_a_child_only_when_passed_to_it(writer: WindowWriter) -> None:
    """Every worker is spawned with its own two descriptors (pass_fds): the next worker must not inherit these."""
    word_fd, wake_fd = writer.child_fds()
    assert not os.get_inheritable(word_fd) and not os.get_inheritable(wake_fd)
    probe = "import os, sys; print(' '.join(str(int(os.path.exists(f'/proc/self/fd/{a}'))) for a in sys.argv[1:]))"
    argv = [sys.executable, "-c", probe, str(word_fd), str(wake_fd)]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split() == ["0", "0"]
    passed = subprocess.run(argv, capture_output=True, text=True, check=True, pass_fds=(word_fd, wake_fd))
    assert passed.stdout.split() == ["1", "1"]

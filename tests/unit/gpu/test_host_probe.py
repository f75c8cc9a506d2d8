"""CPU mode's memory probe: what a worker's task really holds, counted once however many processes share it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from freeride.gpu import HostProbe
from freeride.gpu.probe import process_tree

MiB = 2**20
# A parent that touches 128 MiB, then forks 8 children that touch nothing (blocked on a pipe): a DataLoader's shape.
_FORKED = """
import os, sys
held = bytearray(b"x" * (128 << 20))
r, w = os.pipe()
for _ in range(8):
    if os.fork() == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
print("ready", flush=True)
sys.stdin.read()
"""


def test_pages_shared_with_forked_children_count_once_and_a_groups_memory_current_wins(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _FORKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        tree = process_tree(proc.pid)
        rss_sum = sum(psutil.Process(p).memory_info().rss for p in tree)
        assert len(tree) == 9 and rss_sum > 9 * 128 * MiB  # resident sets say 9 x 128 MiB and more
        used = HostProbe().usage([proc.pid])[proc.pid]
        assert 128 * MiB < used < 2 * 128 * MiB  # 128 MiB once, plus nine small Pythons' own pages
        # A worker in a group of its own that accounts memory: the kernel's count for the group, not PSS.
        (tmp_path / "memory.current").write_text(f"{77 * MiB}\n")
        (tmp_path / "no-accounting").mkdir()  # a group without the memory controller: PSS again
        groups = {proc.pid: tmp_path, os.getpid(): tmp_path / "no-accounting"}
        sampled = HostProbe(groups.get).usage([proc.pid, os.getpid()])
        assert sampled[proc.pid] == 77 * MiB and 0 < sampled[os.getpid()] < 1024 * MiB
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    assert HostProbe().usage([proc.pid]) == {proc.pid: 0}  # gone: nothing held

"""The task logs' total on disk, kept under `--log-total-bytes` by removing the oldest output first.

Each task's log is capped (`--log-max-bytes`, twice that with its rotated part), but tasks are many: without a
total, a few chatty tasks fill the state disk and every task's checkpoint fails with it. The log writer thread
counts what it writes into an index of the log files (size, last write); when the total passes the budget it
lists the directory again (what `freeride rm`, `prune` or an operator removed meanwhile leaves the count) and
removes whole files, the least recently written first, down to 7/8 of the budget (so a task writing at the
limit does not cost a listing per write). A file still being written is closed by the caller before it goes;
the task's next output starts a new one. Used from the writer thread only: no locking here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_LOG_NAME = re.compile(r"task-\d+\.log(\.1)?")  # a task's log and its rotated part (freeride.agent.procs.task_logs)


@dataclass
class _Entry:
    size: int
    written_ns: int  # wall clock of its last write (its mtime when listed)


class TaskLogBudget:
    def __init__(self, log_dir: Path, total_bytes: int, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.log_dir = log_dir
        self.total_bytes = total_bytes
        self._clock_ns = clock_ns
        self._files: dict[Path, _Entry] = {}
        self.used_bytes = 0
        self._listed = False

    def rescan(self) -> None:
        """Count the log files as they are on disk now."""
        files: dict[Path, _Entry] = {}
        try:
            with os.scandir(self.log_dir) as it:
                for e in it:
                    if not _LOG_NAME.fullmatch(e.name):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            files[Path(e.path)] = _Entry(st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            pass
        self._files = files
        self.used_bytes = sum(e.size for e in files.values())
        self._listed = True

    def wrote(self, path: Path, nbytes: int) -> None:
        """`nbytes` were appended to `path` now."""
        if not self._listed:
            self.rescan()  # (the first write after the agent started: the files of earlier runs count too)
        entry = self._files.setdefault(path, _Entry(0, 0))
        entry.size += nbytes
        entry.written_ns = self._clock_ns()
        self.used_bytes += nbytes

    def renamed(self, src: Path, dst: Path) -> None:
        """`src` replaced `dst` (a log rotated): `dst`'s old content is gone."""
        old = self._files.pop(dst, None)
        if old is not None:
            self.used_bytes -= old.size
        moved = self._files.pop(src, None)
        if moved is not None:
            self._files[dst] = moved

    def enforce(self, close: Callable[[Path], None]) -> tuple[int, int]:
        """Over the budget: remove the least recently written files down to 7/8 of it, calling `close(path)`
        first (the writer closes the file if it has it open). (files, bytes) removed."""
        if self.used_bytes <= self.total_bytes:
            return 0, 0
        self.rescan()
        if self.used_bytes <= self.total_bytes:
            return 0, 0
        target = self.total_bytes - self.total_bytes // 8
        count = freed = 0
        for path, entry in sorted(self._files.items(), key=lambda item: (item[1].written_ns, str(item[0]))):
            if self.used_bytes <= target:
                break
            close(path)
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("task logs: could not remove %s to keep --log-total-bytes: %s", path, exc)
                continue
            del self._files[path]
            self.used_bytes -= entry.size
            count, freed = count + 1, freed + entry.size
        log.info("task logs: over --log-total-bytes (%d bytes): removed the %d least recently written file(s), "
                 "%d bytes", self.total_bytes, count, freed)
        return count, freed

"""An append-only JSON-lines output: one line per finished piece of work, each line whole or absent.

A line is written with one `write()` to a file opened O_APPEND, as soon as its piece is finished: a
killed process does not undo it (the page cache keeps it). `sync()` (called when the task
checkpoints, before the checkpoint that counts the lines is written) makes the lines durable against
a power cut too. A line cut short (a machine that went down mid-write) is the only thing `open_lines`
ever removes: it truncates the file to its last newline, and the piece is done again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Lines:
    """The output file at `path`: the lines already in it (`existing`), and `append` for new ones."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.existing = _read_whole_lines(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._dirty = False

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: the rest would be a torn line; say so rather than go on
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes")
        self._dirty = True

    def sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        self.sync()
        os.close(self._fd)


def _read_whole_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        log.warning("%s ends with a line cut short (%d bytes); removed, its work is done again", path,
                    len(data) - len(whole))
        os.truncate(path, len(whole))
    records = []
    for number, line in enumerate(whole.decode().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(f"{path} line {number} is not JSON: is this another program's file? pass another "
                             "output path") from None
    return records

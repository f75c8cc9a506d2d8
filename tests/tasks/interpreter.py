"""A side task that writes down which interpreter runs it: in its reference check and in its worker."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from freeride import IterativeTask


def _write(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"marked": os.environ.get("FREERIDE_TEST_INTERPRETER", ""),
                               "executable": sys.executable}))
    os.replace(tmp, path)


class ReportsInterpreter(IterativeTask):
    """Writes {marked, executable} to `path` in setup, and beside it (.check.json) in the submit's check."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @classmethod
    def check_args(cls, **kwargs: object) -> None:
        _write(Path(str(kwargs["path"])).with_suffix(".check.json"))

    def setup(self) -> None:
        _write(self.path)

    def step(self) -> None:
        pass

"""One check in a process of its own: `python -m freeride.tooling.gpucheck.child TARGET CONTEXT.json OUTCOME.json`.

Imports the check function TARGET ("package.module:function" or "/path/to/file.py:function"), calls
it with the CheckContext the runner wrote, and writes its Outcome. An exception is left to end the
process with its traceback on stderr: the runner reads a missing outcome as a crash and reports the
traceback's tail.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from freeride.tooling.gpucheck.model import CheckContext, Outcome


def load_target(target: str) -> Callable[[CheckContext], Outcome]:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"check target {target!r} is not 'module:function' or 'file.py:function'")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn: Callable[[CheckContext], Outcome] = getattr(module, name)
    return fn


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m freeride.tooling.gpucheck.child TARGET CONTEXT.json OUTCOME.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    target, context, out = argv
    outcome = load_target(target)(CheckContext.load(Path(context)))
    outcome.save(Path(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

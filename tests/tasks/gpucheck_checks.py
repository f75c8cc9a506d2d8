"""Checks for the gpu-check runner's tests: one that passes, one that hangs (after starting a process that
leaves its process group), one that crashes."""

from __future__ import annotations

import subprocess
import sys
import threading

from freeride.tooling.gpucheck.model import CheckContext, Outcome, passed


def ok(ctx: CheckContext) -> Outcome:
    return passed("fine", check=ctx.check, fake=ctx.fake)


def hang(ctx: CheckContext) -> Outcome:
    stray = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"],
                             start_new_session=True)
    print(f"stray {stray.pid}", flush=True)
    threading.Event().wait()  # never set: only the runner's kill ends this
    return passed("unreachable")


def crash(ctx: CheckContext) -> Outcome:
    raise RuntimeError("boom: the check broke")

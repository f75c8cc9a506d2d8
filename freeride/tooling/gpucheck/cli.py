"""`freeride gpu-check --out DIR [--fake-gpu] [--only a,b] [--skip a,b] [--budget-s N] [--gpu N]`.

Exit code 0 when no check failed, 1 when one did, 2 on a usage error (one line: what is wrong, what to do).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from freeride.cli.common import seconds, whole
from freeride.errors import FreerideError
from freeride.tooling.gpucheck import registry, report
from freeride.tooling.gpucheck.model import FAILED

if TYPE_CHECKING:
    from freeride.tooling.gpucheck.runner import Cuda

DEFAULT_BUDGET_S = 480.0


def _names(text: str) -> list[str]:
    """An argparse type: a comma-separated list of check names, each one known."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.NAMES]
    if unknown or not names:
        what = f"unknown check {', '.join(map(repr, unknown))}" if unknown else "no check named"
        raise argparse.ArgumentTypeError(f"{what}; the checks are {','.join(registry.NAMES)}")
    return names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpu-check", help="check a GPU host end to end; writes DIR/gpu-check.json and DIR/gpu-check.md",
        description="Run every check of a GPU host, each in its own process within its own time budget, and "
                    "write a report. Exit code 0: no check failed; 1: one did; 2: a usage error.",
        epilog="checks, in the order they run:\n" + "\n".join(f"  {c.name:<14} {c.about}" for c in registry.CHECKS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write the report (created)")
    p.add_argument("--fake-gpu", action="store_true",
                   help="rehearse on the fake GPU and the stand-in MPS control program (no GPU needed); the checks "
                        "that need CUDA are skipped")
    p.add_argument("--only", type=_names, default=[], metavar="a,b", help="run only these checks")
    p.add_argument("--skip", type=_names, default=[], metavar="a,b", help="leave these checks out")
    p.add_argument("--budget-s", type=seconds(0, above=True), default=DEFAULT_BUDGET_S, metavar="N",
                   help=f"the whole run's time budget (default {DEFAULT_BUDGET_S:g}); each check's is cut to fit")
    p.add_argument("--gpu", type=whole(0), default=0, metavar="N", help="the GPU index to check (default 0)")
    p.set_defaults(func=cmd_gpu_check)


def _mode(fake: bool, cuda: Cuda) -> tuple[str, str]:
    if fake:
        return "fake", "--fake-gpu rehearsal (fake GPU, stand-in MPS control program; CUDA checks skipped)"
    if cuda.available:
        return "gpu", "GPU run"
    return "no-gpu", f"not a GPU run: {cuda.why_not}"


def cmd_gpu_check(ns: argparse.Namespace) -> int:
    from freeride.tooling.gpucheck.runner import RunPlan, run_checks  # psutil and the rest: only when it runs

    specs = registry.select(ns.only, ns.skip)
    if not specs:
        raise FreerideError(f"nothing to run: --skip {','.join(ns.skip)} leaves none of --only {','.join(ns.only)}")
    out: Path = ns.out
    if out.exists() and not out.is_dir():
        raise FreerideError(f"--out {out} is a file; give a directory (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / report.LOG_NAME
    log_path.write_text("")
    plan = RunPlan(fake=ns.fake_gpu, gpu=ns.gpu, budget_s=ns.budget_s, log_path=log_path)
    started, t0 = time.time(), time.monotonic()
    print(f"freeride gpu-check: {len(specs)} check(s), budget {ns.budget_s:g} s"
          + (", fake GPU" if ns.fake_gpu else ""), flush=True)
    results, cuda = run_checks(specs, plan, on_result=lambda r: print(report.line(r), flush=True))
    mode, note = _mode(ns.fake_gpu, cuda)
    args = {"fake_gpu": ns.fake_gpu, "only": ns.only, "skip": ns.skip, "budget_s": ns.budget_s, "gpu": ns.gpu}
    data = report.build(results, mode=mode, mode_note=note, args=args, started_unix_s=started,
                        duration_s=time.monotonic() - t0)
    js, md = report.write(out, data)
    bad = [r.name for r in results if r.verdict == FAILED]
    print(f"{note}; {data['duration_s']:.0f} s; " + (f"FAILED: {', '.join(bad)}" if bad else "no check failed")
          + f"; report: {js}, {md}", flush=True)
    sys.stdout.flush()
    return 1 if bad else 0

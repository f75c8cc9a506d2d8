"""Run the checks one after the other, each in a child process of its own and within its own time budget.

A check's budget is its own (registry.py) cut to what the run has left, less the least the checks
after it need; a check whose least need no longer fits is skipped, saying so. At its budget the
child's process group is killed; then every process that still carries the check's environment mark
(an agent, its workers, an MPS daemon that left the group) is killed too and listed in the details.
A child that ends without an outcome crashed: the tail of its output says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freeride.tooling.gpucheck import procs
from freeride.tooling.gpucheck.model import (
    MARK_ENV,
    CheckContext,
    CheckResult,
    Outcome,
    failed,
    skipped,
)
from freeride.tooling.gpucheck.registry import CheckSpec

_PROBE = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.cuda.is_available(), "
          "'count': torch.cuda.device_count() if torch.cuda.is_available() else 0}))")
_PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunPlan:
    fake: bool
    gpu: int
    budget_s: float
    log_path: Path | None = None  # every check's output, one after the other


@dataclass(frozen=True)
class Cuda:
    available: bool
    why_not: str = ""  # why not, e.g. "torch 2.13.0+cpu sees no CUDA device"

    @property
    def skip_reason(self) -> str:
        """What a check that needs CUDA says when it is skipped."""
        return f"needs CUDA: {self.why_not}"


def fake_cuda() -> Cuda:
    return Cuda(False, "this is a --fake-gpu rehearsal (the fake GPU has no CUDA)")


def cuda_from(details: dict[str, Any]) -> Cuda | None:
    """What the environment check found about torch and CUDA, if it ran."""
    torch = details.get("torch")
    if not isinstance(torch, dict):
        return None
    return _cuda(torch.get("version"), bool(torch.get("cuda_available")), torch.get("error", ""))


def probe_cuda(timeout_s: float = _PROBE_TIMEOUT_S) -> Cuda:
    """Whether torch sees a CUDA device, asked of a child process (this one stays free of CUDA)."""
    res = procs.run([sys.executable, "-c", _PROBE], timeout_s)
    try:
        data = json.loads(res["stdout"].strip().splitlines()[-1])
    except (IndexError, ValueError):
        return _cuda(None, False, procs.last_line(res["stderr"]) or f"the probe exited {res['rc']}")
    return _cuda(data["torch"], bool(data["cuda"]), "")


def _cuda(version: str | None, available: bool, error: str) -> Cuda:
    if available:
        return Cuda(True)
    if not version:
        return Cuda(False, f"torch does not import ({error or 'not installed'})")
    return Cuda(False, f"torch {version} sees no CUDA device" + (f" ({error})" if error else ""))


def run_checks(specs: Sequence[CheckSpec], plan: RunPlan,
               on_result: Callable[[CheckResult], None] = lambda r: None) -> tuple[list[CheckResult], Cuda]:
    """Every check of `specs` in order; the results and what was found about CUDA."""
    deadline = time.monotonic() + plan.budget_s
    results: list[CheckResult] = []
    cuda: Cuda | None = fake_cuda() if plan.fake else None
    for i, spec in enumerate(specs):
        if cuda is None and spec.name != "environment":
            env = next((r for r in results if r.name == "environment"), None)
            cuda = (cuda_from(env.details) if env else None) or probe_cuda()
        if spec.needs_cuda and cuda is not None and not cuda.available:
            result = CheckResult.of(spec.name, skipped(cuda.skip_reason), 0.0, 0.0)
        else:
            remaining = deadline - time.monotonic()
            later = [s for s in specs[i + 1:] if not (s.needs_cuda and cuda is not None and not cuda.available)]
            reserve = sum(s.min_s for s in later)
            timeout = min(spec.budget(plan.fake), max(spec.min_s, remaining - reserve))
            if remaining < spec.min_s:
                why = (f"over the run's budget: needs at least {spec.min_s:.0f} s, {max(0.0, remaining):.0f} s left "
                       f"of --budget-s {plan.budget_s:g}")
                result = CheckResult.of(spec.name, skipped(why), 0.0, 0.0)
            else:
                result = run_isolated(spec, plan, cuda is not None and cuda.available, timeout)
        results.append(result)
        on_result(result)
    return results, cuda or Cuda(False, "not probed")


def run_isolated(spec: CheckSpec, plan: RunPlan, cuda: bool, timeout_s: float) -> CheckResult:
    """One check in a child process of its own, killed with its process group at `timeout_s`."""
    with tempfile.TemporaryDirectory(prefix="frgc-", dir="/tmp") as tmp:
        work = Path(tmp)
        ctx = CheckContext(spec.name, plan.fake, plan.gpu, cuda, time.monotonic() + timeout_s, str(work))
        ctx.save(work / "context.json")
        mark = f"{spec.name}-{uuid.uuid4().hex[:12]}"
        log_path = work / "output.log"
        t0 = time.monotonic()
        timed_out = False
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "freeride.tooling.gpucheck.child", spec.target, str(work / "context.json"),
                 str(work / "outcome.json")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=procs.child_env({MARK_ENV: mark}), start_new_session=True,
            )
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                procs.kill_group(proc.pid)
                code = proc.wait()
            except BaseException:  # Ctrl-C: the child has a session of its own, so it is ended here
                procs.kill_group(proc.pid)
                proc.wait()
                procs.sweep(MARK_ENV, mark)
                raise
        left = procs.sweep(MARK_ENV, mark)
        duration = time.monotonic() - t0
        output = log_path.read_text(errors="replace")
        outcome = _judge(work / "outcome.json", code, timed_out, timeout_s, output)
    if left:
        outcome.details["left_running"] = left  # killed by the sweep: a check (or what it drove) did not clean up
    if plan.log_path is not None:
        with open(plan.log_path, "a") as f:
            f.write(f"===== {spec.name}: {outcome.verdict} in {duration:.1f} s (exit code {code}) =====\n{output}\n")
    return CheckResult.of(spec.name, outcome, duration, timeout_s)


def _judge(outcome_path: Path, code: int, timed_out: bool, timeout_s: float, output: str) -> Outcome:
    if timed_out:
        return failed(f"timed out after {timeout_s:.0f} s (its budget): killed with its process group",
                      output_tail=procs.tail(output))
    if outcome_path.exists():
        try:
            outcome = Outcome.load(outcome_path)
        except (ValueError, TypeError) as exc:
            return failed(f"wrote an unreadable outcome: {exc}", output_tail=procs.tail(output))
        if code != 0:
            outcome.details["exit_code"] = code
        return outcome
    return failed(f"crashed (exit code {code}): {procs.last_line(output) or 'no output'}",
                  output_tail=procs.tail(output))

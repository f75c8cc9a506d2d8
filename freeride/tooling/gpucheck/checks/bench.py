"""`overhead`, `control`, `harvest`: the benchmarks as they ship (`freeride bench … --json`), each in its own
process; the whole JSON is kept and every run in it is compared with the targets (targets.py). Failed only
when the benchmark does not run; a missed target is a finding, not a failure.

Options the benchmarks gained since this was written are used when their --help lists them (overhead's
--edge-sync, harvest's CPU placement). On a host with 4 CPUs or more the synthetic trainer and the agent get
a core each (neither is CPU 0, which takes the host's interrupts). With --fake-gpu the counts are small: the
run proves the path, its numbers are a CPU's.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from freeride.tooling.gpucheck import procs, targets
from freeride.tooling.gpucheck.model import FAILED, CheckContext, Outcome, failed, passed

_MARGIN_S = 5.0  # of the check's budget, kept to write the outcome once the benchmark has been stopped


def _help(bench: str) -> str:
    res = procs.run(procs.freeride_argv("bench", bench, "--help"), 60)
    return str(res["stdout"])


def _placement(help_text: str) -> tuple[list[str], dict[str, Any]]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 4:
        return [], {"pinned": False, "why": f"{len(cpus)} usable CPUs (pinning needs 4 or more)"}
    if "--trainer-cpus" not in help_text or "--agent-cpus" not in help_text:
        return [], {"pinned": False, "why": "this benchmark has no --trainer-cpus/--agent-cpus"}
    trainer, agent = str(cpus[1]), str(cpus[2])
    return ["--trainer-cpus", trainer, "--agent-cpus", agent], {"pinned": True, "trainer_cpus": trainer,
                                                                "agent_cpus": agent}


def _bench(ctx: CheckContext, bench: str, args: list[str], timeout_s: float) -> tuple[Any, dict[str, Any], str]:
    """One benchmark run: its JSON (None if it did not run), what the run was, and why it failed ("" if not)."""
    argv = procs.freeride_argv("bench", bench, "--json", *args)
    res = procs.run(argv, timeout_s)
    record = {"argv": argv[1:], "rc": res["rc"], "duration_s": round(res["duration_ms"] / 1e3, 1),
              "stderr_tail": procs.tail(res["stderr"], lines=20)}
    if res["timed_out"]:
        return None, record, f"bench {bench} did not finish within {timeout_s:.0f} s"
    result = _json(res["stdout"])
    if res["rc"] != 0 or result is None:
        why = procs.last_line(res["stderr"]) or procs.last_line(res["stdout"]) or res.get("error", "")
        return None, record, f"bench {bench} exited {res['rc']}: {why}"
    return result, record, ""


def _outcome(bench: str, result: Any, details: dict[str, Any], problem: str) -> Outcome:
    rows = targets.measure(bench, result) if result is not None else []
    details.update(result=result, targets=rows)
    if problem:
        return failed(problem, **details)
    met = [r for r in rows if r["met"]]
    missed = [r for r in rows if r["met"] is False]
    shown = ", ".join(f"{r['run']} {r['target']} {r['value']:g} (target {r['op']} {r['limit']:g})" for r in missed[:3])
    summary = f"{len(met)} of {len(rows)} targets met" + (f"; missed: {shown}" if missed else "")
    return passed(summary, **details)


def _run(ctx: CheckContext, bench: str, args: list[str], details: dict[str, Any]) -> Outcome:
    result, record, problem = _bench(ctx, bench, args, ctx.left_s(_MARGIN_S))
    details.update(record)
    return _outcome(bench, result, details, problem)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            return None
        try:
            return json.loads(text[start:end + 1])
        except ValueError:
            return None


def _edge_modes(help_text: str) -> list[str]:
    """The --edge-sync modes the benchmark offers (its --help), "all" left out: one run each."""
    m = re.search(r"--edge-sync \{([a-z,]+)\}", help_text)
    return [mode for mode in m.group(1).split(",") if mode != "all"] if m else []


def overhead(ctx: CheckContext) -> Outcome:
    """One `bench overhead` per --edge-sync mode (all of them, when offered), each given what is left of the
    budget: a budget that runs short costs the last modes (noted), not the ones measured. Failed when a mode
    exits with an error, or when no mode finished."""
    program = ctx.mps_program()
    args = ["--mps", "both", "--mps-control", program] if program else ["--mps", "off"]
    modes = _edge_modes(_help("overhead"))
    details: dict[str, Any] = {"mps": "both" if program else "off (nvidia-cuda-mps-control is not on PATH)",
                               "edge_sync": modes or "not offered by this bench", "runs": {}}
    if not modes:
        return _run(ctx, "overhead", args, details)
    results: dict[str, Any] = {}
    problems, notes = [], []
    for i, mode in enumerate(modes):
        if ctx.left_s(_MARGIN_S) < 30:
            notes.append(f"out of the check's budget before --edge-sync {', '.join(modes[i:])}")
            break
        result, record, problem = _bench(ctx, "overhead", [*args, "--edge-sync", mode], ctx.left_s(_MARGIN_S))
        details["runs"][mode] = record
        if result is not None:
            results[mode] = result
        elif problem.startswith("bench overhead did not finish"):  # the budget ran out: noted
            notes.append(f"--edge-sync {mode}: {problem}")
        else:
            problems.append(f"--edge-sync {mode}: {problem}")
    if not results and not problems:
        problems = notes
    details["notes"] = notes
    outcome = _outcome("overhead", {"edge_sync": results} if results else None, details, "; ".join(problems))
    if notes and outcome.verdict != FAILED:
        outcome.summary += "; " + "; ".join(notes)
    return outcome


def control(ctx: CheckContext) -> Outcome:
    pin, placement = _placement(_help("control"))
    args = [*pin, *(["--bubbles", "200"] if ctx.fake else [])]
    return _run(ctx, "control", args, {"placement": placement, "small": ctx.fake})


def harvest(ctx: CheckContext) -> Outcome:
    pin, placement = _placement(_help("harvest"))
    size = (["-p", "2", "-m", "2", "-F", "5", "-B", "10", "-S", "2", "--iterations", "8"] if ctx.fake
            else ["-p", "4", "-m", "4", "-F", "20", "-B", "40", "-S", "5", "--iterations", "60"])
    return _run(ctx, "harvest", [*pin, *size], {"placement": placement, "small": ctx.fake})

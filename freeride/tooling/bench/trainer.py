"""`freeride bench trainer`: the cost of instrumentation on a real CPU pipeline, plain and instrumented
steps alternated in one run (odd iterations instrumented), with an agent per rank and no side task.

`--framework torch` (torch.distributed.pipelining) or `deepspeed` (a PipelineEngine driven by
`train_batch`, hooked by freeride.trainer.deepspeed): both are measured the same way. The torch run
defaults to the sleep model (known bubbles); the DeepSpeed run to the shape of DeepSpeedExamples'
pipeline clients: 2 stages of Linear + ReLU layers (`--model mlp`), real compute, bubbles of a few
milliseconds. `--path` picks the ranks' road to their agents (they get $FREERIDE_BUBBLE_PATH); each
rank says which one it took. `--cpus` pins rank r to the r-th CPU of the list: on a machine with few
cores, unpinned ranks share a core in some runs and not in others, and that swamps what is measured.

`overhead_ratio` is the median of each instrumented step over the mean of the plain steps on either
side; `null_ratio` is the same figure for each plain step against the plain steps two away (A/A):
what the machine's noise alone gives, so a result is read against it. Both lean below 1 where steps
have rare long outliers (one in a neighbour lifts the mean, one in the step itself barely moves the
median): `balanced_ratio` takes that out, as the square root of the paired median over the same
median taken the other way round (each plain step over its instrumented neighbours).
`cpu_overhead_ratio`, `cpu_null_ratio` and `cpu_balanced_ratio` are the same figures for the training
thread's CPU time per step, which other load on the machine disturbs far less than wall time: the
hooks' own cost, to a fraction of a percent.

`--startup-runs N` (DeepSpeed) measures what the alternation cannot: a job's own start. Separate plain and
instrumented jobs, alternated, with no agent, an idle agent and an agent whose task fits no bubble; the first 30
steps and the steady state apart (freeride.tooling.bench.startup).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import psutil

from freeride.core.cpu import allowed_cpus, format_cpu_list, parse_cpu_list
from freeride.errors import FreerideError
from freeride.tooling.bench import paths, startup
from freeride.tooling.bench.pipeline import SCHEDULES, SINGLE, PipelineConfig, launch
from freeride.tooling.harness import AgentProcess
from freeride.trainer.waits import DEFAULT_QUIET_SAMPLE_MS

_WARMUP = 2  # iterations left out: the first sets the pipeline up
FRAMEWORKS = ("torch", "deepspeed")
# Per framework: stages, model, dim, micro-batch size, layers per stage (what an option left out means)
_DEFAULTS = {"torch": (4, "sleep", 32, 2, 2), "deepspeed": (2, "mlp", 512, 16, 2)}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--framework", default="torch", choices=FRAMEWORKS,
                   help="torch: torch.distributed.pipelining; deepspeed: a DeepSpeed PipelineEngine (train_batch)")
    p.add_argument("--schedule", default="1F1B", choices=SCHEDULES, help="torch only (DeepSpeed runs its 1F1B)")
    p.add_argument("--stages", type=int, help="ranks in the pipeline (default: 4 torch, 2 deepspeed)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--model", choices=("sleep", "mlp"),
                   help="sleep: F/B ms of sleep around a tiny layer; mlp: Linear + ReLU layers, real compute "
                        "(default: sleep torch, mlp deepspeed)")
    p.add_argument("--forward-ms", type=float, default=10.0, help="sleep model")
    p.add_argument("--backward-ms", type=float, default=20.0, help="sleep model")
    p.add_argument("--dim", type=int, help="layer width (default: 32 torch, 512 deepspeed)")
    p.add_argument("--microbatch-size", type=int, help="samples per micro-batch (default: 2 torch, 16 deepspeed)")
    p.add_argument("--layers-per-stage", type=int, help="mlp model (default: 2)")
    p.add_argument("--iterations", type=int, default=63)
    p.add_argument("--quiet-sample-ms", type=float, default=DEFAULT_QUIET_SAMPLE_MS,
                   help="deepspeed: while the agent is quiet, time one step this often, the others unhooked "
                        f"(default {DEFAULT_QUIET_SAMPLE_MS:g}, instrument()'s; 0: every step)")
    p.add_argument("--startup-runs", type=int, default=0, metavar="N",
                   help="deepspeed: instead, N plain and N instrumented jobs of their own, alternated, with no "
                        "agent, an idle agent and an agent with a task that fits no bubble; the first 30 steps "
                        "and the steady state apart (freeride.tooling.bench.startup)")
    p.add_argument("--startup-settings", default=",".join(startup.SETTINGS), metavar="LIST",
                   help=f"--startup-runs: which of {', '.join(startup.SETTINGS)} to run (default: all, in that order)")
    p.add_argument("--startup-task-ms", type=float, default=50.0,
                   help="--startup-runs: the step of the task that fits none of the job's bubbles")
    p.add_argument("--cpus", metavar="LIST", help="pin rank r to the r-th of these CPUs (mod their count), e.g. 0,1")
    paths.add_arg(p)


def _cpus(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(sorted(allowed_cpus(parse_cpu_list(text), "--cpus", "this machine's")))
    except ValueError as exc:
        raise FreerideError(f"bench trainer: {exc}") from None


def run(ns: argparse.Namespace) -> dict[str, Any]:
    _cpus(ns.cpus)  # a bad list is refused before anything starts
    if ns.startup_runs:
        if ns.framework != "deepspeed" or ns.startup_runs < 2 or ns.iterations <= startup.FIRST:
            raise FreerideError(f"bench trainer: --startup-runs wants --framework deepspeed, 2 runs or more and "
                                f"--iterations above {startup.FIRST}")
        try:
            ns.startup_settings = startup.settings(ns.startup_settings)
        except ValueError as exc:
            raise FreerideError(f"bench trainer: {exc}") from None
        return paths.run("trainer", ns, lambda ns, path: startup.run(ns, _config(ns, Path(), path), path))
    return paths.run("trainer", ns, _run)


def _config(ns: argparse.Namespace, root: Path, path: str) -> PipelineConfig:
    stages, model, dim, mbs, layers = _DEFAULTS[ns.framework]
    return PipelineConfig(
        framework=ns.framework, schedule=ns.schedule if ns.framework == "torch" else "1F1B",
        stages=ns.stages or stages, microbatches=ns.microbatches, model=ns.model or model,
        forward_ms=ns.forward_ms, backward_ms=ns.backward_ms, dim=ns.dim or dim,
        microbatch_size=ns.microbatch_size or mbs,
        layers_per_stage=ns.layers_per_stage or layers, iterations=ns.iterations, instrument=True,
        socket_dir=str(root), alternate=True, bubble_path=paths.reporter_path(path), cpus=_cpus(ns.cpus),
        quiet_sample_ms=ns.quiet_sample_ms,
    )


def _paired(steps: list[float], gap: int, first: int) -> list[float]:
    """Each step from `first` on (every second one) over the mean of its neighbours `gap` away."""
    return [steps[i] / ((steps[i - gap] + steps[i + gap]) / 2) for i in range(first, len(steps) - gap, 2)]


def _balanced(paired: list[float], inverse: list[float]) -> float:
    """The cost with the estimator's own bias taken out: each instrumented step over its plain neighbours (the
    cost times a bias: a step's outliers weigh on one side only) against each plain step over its instrumented
    neighbours (the same bias over the cost); the square root of their medians' quotient is the cost alone."""
    return round(math.sqrt(statistics.median(paired) / statistics.median(inverse)), 4)


def _run(ns: argparse.Namespace, path: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="freeride-bench-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        cfg = _config(ns, root, path)
        agents = [stack.enter_context(AgentProcess(state_dir=root / f"state{r}", gpu=r, extra_args=paths.AGENT_ARGS))
                  for r in range(cfg.stages)]
        procs = [psutil.Process(a.proc.pid) for a in agents if a.proc is not None]
        cpu_before = [sum(p.cpu_times()[:2]) for p in procs]
        results = launch(cfg, root / "run")
        agent_cpu_s = sum(sum(p.cpu_times()[:2]) for p in procs) - sum(cpu_before)
    plain, instrumented, paired, null, cpu_paired, cpu_null = [], [], [], [], [], []
    inverse, cpu_inverse = [], []  # each plain step over the mean of the instrumented steps on either side
    cpu_timed: list[float] = []  # cpu_paired split: instrumented steps that timed their waits ...
    cpu_untimed: list[float] = []  # ... and the others
    per_rank = []
    v = 1 if cfg.schedule in SINGLE else 2
    for res in results:
        paths.check("trainer", path, res["reporter_path"], f"rank {res['rank']}")
        steps = res["step_ms"]
        plain += [steps[i] for i in range(_WARMUP, len(steps)) if i % 2 == 0]
        instrumented += [steps[i] for i in range(_WARMUP, len(steps)) if i % 2 == 1]
        # Each instrumented step against the mean of the plain steps on either side: slow drifts cancel.
        paired += _paired(steps, 1, _WARMUP + 1)
        null += _paired(steps, 2, _WARMUP + 2)  # plain against plain: the noise floor of the same figure
        inverse += _paired(steps, 1, _WARMUP + 2)
        cpu_inverse += _paired(res["step_cpu_ms"], 1, _WARMUP + 2)
        cpu_paired += _paired(res["step_cpu_ms"], 1, _WARMUP + 1)
        cpu_null += _paired(res["step_cpu_ms"], 2, _WARMUP + 2)
        # The tracker numbers the steps it was enabled for (the instrumented ones): its k-th is that step's index.
        step_of = [i for i in range(len(steps)) if cfg.instrumented(i)]
        timed_steps = {step_of[b["iteration"]] for b in res["bubbles"]}
        iters = sorted(i for i in timed_steps if i >= _WARMUP)
        for i, ratio in zip(range(_WARMUP + 1, len(steps) - 1, 2), _paired(res["step_cpu_ms"], 1, _WARMUP + 1),
                            strict=True):
            (cpu_timed if i in timed_steps else cpu_untimed).append(ratio)
        waits = [b for b in res["bubbles"] if step_of[b["iteration"]] >= _WARMUP and b["kind"] != 5]
        idle_ms = sum((b["end_ns"] - b["start_ns"]) / 1e6 for b in waits)
        busy_ms = sum(steps[i] for i in iters)
        per_rank.append({
            "rank": res["rank"],
            "bubbles_per_iteration": len(waits) / len(iters) if iters else 0,
            "reported_per_iteration": sum(b["reported"] for b in waits) / len(iters) if iters else 0,
            "bubble_fraction_measured": round(idle_ms / busy_ms, 4) if busy_ms else 0.0,
            "bubble_ms_median": round(statistics.median((b["end_ns"] - b["start_ns"]) / 1e6 for b in waits), 3)
            if waits else 0.0,
            "path": res["reporter_path"],
            "dropped_by_reporter": res["reporter_dropped"],
            "agent_wakes": res["reporter_wakes"],
            "untimed_steps": res["untimed_steps"],
        })
    step_plain = statistics.median(plain)
    step_inst = statistics.median(instrumented)
    m = cfg.microbatches
    return {
        "benchmark": "trainer",
        "framework": cfg.framework,
        "path": path,
        "model": cfg.model,
        "schedule": cfg.schedule, "p": cfg.stages, "stages_per_rank": v, "m": m,
        **({"F_ms": cfg.forward_ms, "B_ms": cfg.backward_ms} if cfg.model == "sleep" else
           {"dim": cfg.dim, "microbatch_size": cfg.microbatch_size, "layers_per_stage": cfg.layers_per_stage}),
        "iterations": cfg.iterations,
        "cpus": format_cpu_list(frozenset(cfg.cpus)) if cfg.cpus else "any",
        **({"quiet_sample_ms": cfg.quiet_sample_ms} if cfg.framework == "deepspeed" else {}),
        "step_ms_plain": round(step_plain, 3),
        "step_ms_instrumented": round(step_inst, 3),
        "overhead_ratio": round(statistics.median(paired), 4),
        "null_ratio": round(statistics.median(null), 4),
        "balanced_ratio": _balanced(paired, inverse),
        "overhead_ratio_of_medians": round(step_inst / step_plain, 4),
        "cpu_overhead_ratio": round(statistics.median(cpu_paired), 4),
        "cpu_null_ratio": round(statistics.median(cpu_null), 4),
        "cpu_balanced_ratio": _balanced(cpu_paired, cpu_inverse),
        # While the agent is quiet an integration may time only some steps (WaitTracker.timed): the share of the
        # instrumented steps it timed, and the CPU figure for those and for the others apart.
        "timed_share": round(len(cpu_timed) / (len(cpu_timed) + len(cpu_untimed)), 4) if cpu_paired else 0.0,
        "cpu_overhead_ratio_timed": round(statistics.median(cpu_timed), 4) if cpu_timed else None,
        "cpu_overhead_ratio_untimed": round(statistics.median(cpu_untimed), 4) if cpu_untimed else None,
        "bubble_fraction_measured": round(statistics.mean(r["bubble_fraction_measured"] for r in per_rank), 4),
        "bubble_fraction_theory": round((cfg.stages - 1) / (m * v + cfg.stages - 1), 4),
        "dropped_by_reporter": sum(r["dropped_by_reporter"] for r in per_rank),
        # The agents had nothing to grant: they slept through the run (quiet), woken by no edge.
        "agent_wakes": sum(r["agent_wakes"] for r in per_rank),
        "agent_cpu_ms_per_step": round(1e3 * agent_cpu_s / cfg.iterations, 3),
        "ranks": per_rank,
    }

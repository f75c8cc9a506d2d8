"""What `freeride demo` runs: its flags, the side tasks per stage, the pipeline's sizes (fixed before it starts)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from freeride.cli.common import UsageError
from freeride.tooling.bench.pipeline import PipelineConfig


@dataclass(frozen=True)
class SideTask:
    name: str
    ref: str
    # "{out}" becomes the output dir, "{stage}" the stage, "{device}" cpu (or auto: the agent's GPU with --device cuda)
    args: dict[str, str] = field(default_factory=dict)


# The side tasks the demo can run. Each stage gets all of SIDE_TASKS (--placement all) or one of them, round
# robin (--placement spread); each task's progress() keys are reported as they are. Steps of at most 5 ms:
# a CPU pipeline's bubbles are 20-60 ms, and a step that does not fit the rest of one is not started.
_SMALL_STEPS = {"max_step_ms": "5", "device": "{device}"}
SIDE_TASKS = (
    SideTask("digits-resnet", "sidetasks.cnn:DigitsResNet", {"seed": "{stage}", **_SMALL_STEPS}),
    SideTask("pagerank", "sidetasks.pagerank:PageRank", {"seed": "{stage}", **_SMALL_STEPS}),
    SideTask("thumbnails", "sidetasks.images:Thumbnails", {"out_dir": "{out}/thumbnails-stage{stage}", **_SMALL_STEPS}),
)

_STAGES = 4  # stages by default (on a CPU: at most one per core)
_BLOCKS = 8  # transformer blocks in all, split across the stages by default
_DEFAULT_SCHED = "idle"

# Sizes: a step is real work (~0.5 s on a 2-core CPU) and the whole demo fits in about two minutes.
# The warm-up is long enough for the side tasks' first ~100 steps too: a worker's first steps touch its memory and load
# its kernels for the first time, and on a CPU that cold start slowed the training step by up to +50-100 % for a few
# iterations (then never again). The report shows the warm-up's steps apart; the slowdown is the steady state's.
_FULL = {"warmup": 12, "block": 4, "blocks": 12}  # short blocks: each harvest block is paired with its neighbours
_QUICK = {"warmup": 3, "block": 3, "blocks": 4}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a short run (for tests and a first look)")
    p.add_argument("--block", type=int, help="iterations per baseline or harvest block (default 4; quick 3)")
    p.add_argument("--blocks", type=int, help="baseline and harvest blocks, alternating (even; default 12; quick 4)")
    p.add_argument("--warmup", type=int, help="iterations before the first block, the agents learning bubbles")
    p.add_argument("--stages", type=int,
                   help="pipeline stages, one process and one agent each (default 4; on a CPU at most one per core)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dim", type=int, default=128, help="transformer width")
    p.add_argument("--layers-per-stage", type=int, help="transformer blocks per stage (default: 8 in all)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatch-size", type=int, default=8,
                   help="sequences per micro-batch (default 8: bubbles of tens of ms on a CPU, long against a step)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the stages train: cpu (gloo) or cuda (one GPU per stage, NCCL)")
    p.add_argument("--placement", choices=["all", "spread"], default="all",
                   help="every side task on every stage (default; ~3.5 GB), or one per stage round robin (~1.5 GB)")
    p.add_argument("--worker-nice", type=int, default=19, choices=range(0, 20), metavar="0..19",
                   help="CPU niceness of side-task workers (the agents' --worker-nice; default 19; 0: they compete "
                        "with training as equals)")
    p.add_argument("--worker-sched", choices=["other", "idle"], default=_DEFAULT_SCHED,
                   help=f"the agents' --worker-sched (default {_DEFAULT_SCHED}; idle: SCHED_IDLE, the CPU's "
                        "low-priority MPS client)")
    p.add_argument("--out", type=Path,
                   help="where report.json, timeline.png and profile.png/.json go (default ./freeride-demo-TIME)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


@dataclass(frozen=True)
class Plan:
    """What the run does, fixed before it starts."""

    pipeline: PipelineConfig
    tasks: dict[int, list[SideTask]]  # stage -> its side tasks
    out_dir: Path
    worker_nice: int
    worker_sched: str
    # CPU mode: stage s (its rank and its agent's workers) runs on core cpus[s]; empty with --device cuda
    cpus: tuple[int, ...] = ()

    def phase(self, iteration: int) -> str:
        cfg = self.pipeline
        if iteration < cfg.warmup:
            return "warmup"
        return "harvest" if cfg.instrumented(iteration) else "baseline"


def make_plan(ns: argparse.Namespace) -> Plan:
    missing = [m for m in ("torch", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:  # said before anything starts, not after the run
        raise UsageError(f"freeride demo needs {' and '.join(missing)}: pip install 'freeride[demo]'")
    sizes = dict(_QUICK if ns.quick else _FULL)
    for key in sizes:
        if getattr(ns, key) is not None:
            sizes[key] = getattr(ns, key)
    if sizes["block"] < 1 or sizes["warmup"] < 0:
        raise UsageError("--block must be at least 1 and --warmup at least 0")
    if sizes["blocks"] < 2 or sizes["blocks"] % 2:
        raise UsageError(f"--blocks must be even and at least 2 (baseline and harvest alternate): {sizes['blocks']}")
    stages, cpus = _stages_and_cpus(ns)
    layers = ns.layers_per_stage if ns.layers_per_stage is not None else max(1, _BLOCKS // stages)
    if ns.microbatches < 1 or ns.dim < 8 or ns.dim % 4 or layers < 1 or ns.seq_len < 8:
        raise UsageError("model sizes must be positive: --microbatches >= 1, --dim a multiple of 4 >= 8, "
                         "--layers-per-stage >= 1, --seq-len >= 8")
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA GPU here; leave --device out to train on the CPU")
    out_dir = ns.out or Path.cwd() / time.strftime("freeride-demo-%Y%m%d-%H%M%S")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"--out {out_dir} exists and is not empty; give a new directory")
    cfg = PipelineConfig(
        schedule="1F1B", stages=stages, microbatches=ns.microbatches, model="transformer", dim=ns.dim,
        layers_per_stage=layers, heads=4, seq_len=ns.seq_len, microbatch_size=ns.microbatch_size,
        iterations=sizes["warmup"] + sizes["block"] * sizes["blocks"], warmup=sizes["warmup"], block=sizes["block"],
        alternate=True, instrument=True, record=True, device=ns.device, cpus=cpus,
    )
    if ns.placement == "all":
        tasks = {s: list(SIDE_TASKS) for s in range(stages)}
    else:
        tasks = {s: [SIDE_TASKS[s % len(SIDE_TASKS)]] for s in range(stages)}
    return Plan(cfg, tasks, out_dir.absolute(), ns.worker_nice, ns.worker_sched, cpus)


def _stages_and_cpus(ns: argparse.Namespace) -> tuple[int, tuple[int, ...]]:
    """The stage count and, on a CPU, each stage's core: a stage stands for one GPU, so it gets a core of its own
    (its rank and its agent's workers pinned there); more stages than cores would measure contention instead."""
    if ns.stages is not None and not 2 <= ns.stages <= 8:
        raise UsageError(f"--stages must be between 2 and 8, got {ns.stages}")
    if ns.device == "cuda":
        return ns.stages or _STAGES, ()
    cores = sorted(os.sched_getaffinity(0))
    stages = ns.stages or max(2, min(_STAGES, len(cores)))
    if stages > len(cores):
        raise UsageError(f"--stages {stages}: this host lets the demo use {len(cores)} CPU core(s), and on a CPU each "
                         f"stage stands for one GPU and needs a core of its own; use --stages {len(cores)} or fewer"
                         if len(cores) >= 2 else "the demo needs at least 2 CPU cores (one per pipeline stage) "
                         "or --device cuda")
    return stages, tuple(cores[:stages])

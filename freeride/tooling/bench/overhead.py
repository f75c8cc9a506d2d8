"""`freeride bench overhead`: what side tasks cost the trainer on one GPU, and what they harvest.

Replays one pipeline stage's timeline (1F1B, p stages, m micro-batches, this stage's index) with
real forward and backward kernels of a transformer block in bf16, and idle gaps where the stage
would wait for its neighbours. Iterations alternate: even ones plain (no bubble reported, the side
task idles), odd ones harvested (bubbles reported, the side task runs in them), so slow drifts
cancel. With `--mps both` the whole run is repeated under an MPS daemon the agent starts, with the
trainer a client at normal priority and the side task below it.

The trainer runs in its own process per configuration (`freeride.tooling.bench.replay`), so it can join (or not)
the MPS daemon before it creates its CUDA context. Its kernels are queued as a trainer queues them (no
synchronise after each), and each gap is a pipeline wait through freeride's own WaitTracker with the chosen edge
mode (`--edge-sync stream|event|off|all`). The wait stands for the neighbour's send (`--neighbour`,
`freeride.tooling.bench.neighbours`):

- `wall` (the default on CUDA): the stream stalls for the gap in wall-clock time with no kernel resident (a host
  function on the stream), while the CPU runs on: the data lands `gap` after the stream reached the receive.
- `spin`: a resident kernel spinning on the GPU's global timer for the gap (`--spin-ctas` CTAs), as an NCCL
  receive kernel occupies SMs while it waits (it forces time-slicing without MPS).
- `gpu`: `torch.cuda._sleep`, counted in SM clock cycles (the first GPU run's): when side work lowers the clock,
  every wait gets longer in wall time, an artifact a real pipeline would not see.
- `cpu`: the CPU waits for the stage's GPU to drain, then sleeps the gap.

What a run can resolve (freeride.tooling.bench.readout): each harvested iteration against the mean of the plain
ones on either side, with a bootstrap 95 % interval of the median and an A/A null from the plain iterations of the
same run; per-segment GPU times (the gaps, the first compute after a gap, the other compute); NVML clock and power
tagged by iteration; useful harvest (side steps x their step time on an idle GPU, measured in the run's solo
iterations, over the gaps) beside busy harvest; per-iteration and per-window rows.

`--device cpu` runs the same replay on CPU as a smoke test: its numbers say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from freeride.errors import FreerideError
from freeride.tooling.bench import readout
from freeride.tooling.bench.neighbours import KINDS as NEIGHBOURS
from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
from freeride.trainer.edges import DEFAULT_EDGE_MODE, EDGE_MODES
from freeride.v1 import tasks_pb2


class NeedsGpuError(FreerideError):
    """The benchmark needs CUDA and there is none (or no torch)."""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default); cpu runs the replay as a smoke test that is NOT representative")
    p.add_argument("--stages", "-p", type=int, default=4)
    p.add_argument("--microbatches", "-m", type=int, default=8)
    p.add_argument("--stage", type=int, default=1, help="which stage's timeline to replay (0-based)")
    p.add_argument("--hidden", type=int, default=0, help="model width (default 4096 on cuda, 256 on cpu)")
    p.add_argument("--heads", type=int, default=0, help="attention heads (default hidden/128, at least 1)")
    p.add_argument("--seq", type=int, default=0, help="sequence length (default 2048 on cuda, 64 on cpu)")
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--layers", type=int, default=0,
                   help="transformer blocks in this stage (default 4 on cuda: F ~5 ms, B ~13 ms on an H200; 1 on cpu)")
    p.add_argument("--iterations", type=int, default=0,
                   help="training iterations, alternately plain and harvested (80 on cuda, 38 pairs; 10 on cpu)")
    p.add_argument("--solo-iterations", type=int, default=-1,
                   help="iterations after them with the GPU idle, where the side task runs alone: its idle step time "
                        "(default 6 on cuda, 4 on cpu; 0: none, and no useful harvest)")
    p.add_argument("--side-task", "--task", dest="side_task", default="freeride.tooling.tasks:MatmulTask",
                   help="side task reference (e.g. sidetasks.cnn:DigitsResNet); default a synthetic matmul task")
    p.add_argument("--side-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="argument for the side task (repeatable); the synthetic task takes step_ms and size")
    p.add_argument("--side-step-ms", type=float, default=2.0, help="step time of the synthetic side task")
    p.add_argument("--mps", choices=["off", "start", "both"], default="both",
                   help="run without MPS, with an MPS daemon the agent starts, or both (cuda only)")
    p.add_argument("--mps-control", default="nvidia-cuda-mps-control", help="MPS control program")
    p.add_argument("--mps-thread-percentage", type=int, default=None, metavar="N",
                   help="the agent's --mps-thread-percentage: side tasks use at most N%% of the SMs under MPS "
                        "(default: the agent's, 50; 0: no cap)")
    p.add_argument("--green-sms", type=int, default=0, metavar="N",
                   help="the agent's --green-sms: side tasks' kernels in a CUDA green context of N SMs (0: off)")
    p.add_argument("--margin-ms", type=float, default=None, metavar="MS",
                   help="the agent's --margin-ms: cut from each window's end (default: the agent's)")
    p.add_argument("--edge-sync", choices=[*EDGE_MODES, "all"], default=DEFAULT_EDGE_MODE,
                   help="how the trainer takes bubble edges on CUDA (see instrument(edge_sync=...)); all: each "
                        "mode in turn. On cpu always off")
    p.add_argument("--neighbour", default="wall", metavar="KIND[,KIND]",
                   help=f"how a wait stands for the neighbour's send on cuda, one of {', '.join(NEIGHBOURS)} or a "
                        "comma list (each in turn; both = gpu,cpu): wall stalls the stream for the gap in wall time "
                        "(the default), spin with a resident kernel, gpu with torch.cuda._sleep (SM cycles), cpu "
                        "drains the GPU and sleeps. On cpu always cpu")
    p.add_argument("--spin-ctas", type=int, default=1, help="CTAs of the spin neighbour's kernel (NCCL uses several)")
    p.add_argument("--nvml-ms", type=float, default=10.0, help="NVML clock and power sample period (0: off)")
    p.add_argument("--target", type=float, default=0.005, help="the slowdown the verdict judges against (0.005)")


def run(ns: argparse.Namespace) -> dict[str, Any]:
    _check_device(ns.device)
    if not 0 <= ns.stage < ns.stages:
        raise NeedsGpuError(f"--stage must be in 0..{ns.stages - 1}")
    cpu = ns.device == "cpu"
    neighbours = ["cpu"] if cpu else _neighbours(ns.neighbour)
    shape = {
        "hidden": ns.hidden or (256 if cpu else 4096),
        "seq": ns.seq or (64 if cpu else 2048),
        "micro_batch_size": ns.micro_batch_size,
        "layers": ns.layers or (1 if cpu else 4),
    }
    shape["heads"] = ns.heads or max(1, shape["hidden"] // 128)
    iterations = ns.iterations or (10 if cpu else 80)
    solo = ns.solo_iterations if ns.solo_iterations >= 0 else (4 if cpu else 6)
    modes = ["off"] if cpu else {"off": ["off"], "start": ["start"], "both": ["off", "start"]}[ns.mps]
    side_args = dict(kv.split("=", 1) for kv in ns.side_arg if "=" in kv)
    if ns.side_task.endswith(":MatmulTask"):
        side_args.setdefault("step_ms", str(ns.side_step_ms))
        side_args.setdefault("size", "256" if cpu else "4096")
    edges = ["off"] if cpu else (list(EDGE_MODES) if ns.edge_sync == "all" else [ns.edge_sync])
    runs = [{"mps": mode, "neighbour": nb, "edge_sync": edge,
             **_run_config(ns, mode, edge, nb, shape, iterations, solo, side_args)}
            for mode in modes for nb in neighbours for edge in edges]
    device_name = runs[0]["device_name"]
    for r in runs:
        del r["device_name"]

    def first_run(mps: str) -> dict[str, Any]:
        """The summary figures of this MPS mode's first configuration (no rows), without the mode itself."""
        return {k: v for k, v in next(r for r in runs if r["mps"] == mps).items()
                if k not in ("mps", "rows", "windows_rows", "nvml")}

    out: dict[str, Any] = {
        "benchmark": "overhead",
        "device": ns.device,
        "device_name": device_name,
        "representative": not cpu,
        "note": "CPU smoke test: not representative of a GPU" if cpu else "",
        "schedule": "1F1B", "p": ns.stages, "m": ns.microbatches, "stage": ns.stage, **shape,
        "iterations": iterations, "solo_iterations": solo, "side_task": ns.side_task, "side_args": side_args,
        "mps_thread_percentage": ns.mps_thread_percentage, "green_sms": ns.green_sms, "margin_ms": ns.margin_ms,
        "target": ns.target,
        "mps": modes[0], **first_run(modes[0]), "runs": runs,
    }
    if "start" in modes and modes[0] != "start":
        out["with_mps"] = first_run("start")
    return out


def _neighbours(spec: str) -> list[str]:
    kinds = ["gpu", "cpu"] if spec == "both" else [k.strip() for k in spec.split(",") if k.strip()]
    bad = [k for k in kinds if k not in NEIGHBOURS]
    if bad or not kinds:
        raise NeedsGpuError(f"--neighbour {spec!r}: each must be one of {', '.join(NEIGHBOURS)} (or both)")
    return kinds


def _check_device(device: str) -> None:
    try:
        import torch
    except ImportError:
        raise NeedsGpuError("freeride bench overhead needs torch (pip install 'freeride[torch]')") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise NeedsGpuError("freeride bench overhead needs a CUDA GPU and none is visible; "
                            "--device cpu runs it as a smoke test that is not representative")


def _run_config(ns: argparse.Namespace, mode: str, edge: str, neighbour: str, shape: dict[str, int],
                iterations: int, solo: int, side_args: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="frbench-", dir="/tmp") as tmp:
        root = Path(tmp)
        extra = ["--headroom", "0"]
        if ns.margin_ms is not None:
            extra += ["--margin-ms", str(ns.margin_ms)]
        if ns.green_sms:
            extra += ["--green-sms", str(ns.green_sms)]
        env = dict(os.environ)
        if mode == "start":
            pipe = root / "mps" / "pipe"
            extra += ["--mps", "start", "--mps-control", ns.mps_control, "--mps-pipe-dir", str(pipe),
                      "--mps-log-dir", str(root / "mps" / "log")]
            if ns.mps_thread_percentage is not None:
                extra += ["--mps-thread-percentage", str(ns.mps_thread_percentage)]
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)  # the trainer joins the daemon at normal priority
            env["CUDA_MPS_LOG_DIRECTORY"] = str(root / "mps" / "log")
        with AgentProcess(state_dir=root / "state", extra_args=extra) as agent, agent.client() as client:
            task = client.submit(tasks_pb2.TaskSpec(name="side", ref=ns.side_task, args=side_args))
            wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY], timeout_s=300)
            with WindowCollector(client) as collector:
                plan = {"target": agent.target, "device": ns.device, "p": ns.stages, "m": ns.microbatches,
                        "stage": ns.stage, "iterations": iterations, "solo_iterations": solo, "edge_sync": edge,
                        "neighbour": neighbour, "spin_ctas": ns.spin_ctas, "nvml_ms": ns.nvml_ms, **shape}
                res = subprocess.run([sys.executable, "-m", "freeride.tooling.bench.replay", json.dumps(plan)],
                                     env=env, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    tail = "\n".join(res.stderr.strip().splitlines()[-8:])
                    raise FreerideError(f"the trainer replay failed (exit {res.returncode}):\n{tail}")
                trainer = json.loads(res.stdout.strip().splitlines()[-1])
                collector.wait_for_all(client, 5.0)  # the replay has exited: its trainer stream is ending
                windows = list(collector.windows)
            info = client.get(task.id)
    return readout.summarise(trainer, windows, info, ns.target)

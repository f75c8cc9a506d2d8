"""`freeride bench overhead`: what side tasks cost the trainer on one GPU, and what they harvest.

Replays one pipeline stage's timeline (1F1B, p stages, m micro-batches, this stage's index) with
real forward and backward kernels of a transformer block in bf16, and idle gaps where the stage
would wait for its neighbours. Iterations alternate: even ones plain (no bubble reported, the side
task idles), odd ones harvested (bubbles reported, the side task runs in them), so slow drifts
cancel. With `--mps both` the whole run is repeated under an MPS daemon the agent starts, with the
trainer a client at normal priority and the side task below it.

The trainer runs in its own process per configuration, so it can join (or not) the MPS daemon
before it creates its CUDA context. Its kernels are queued as a trainer queues them (no
synchronise after each), and each gap is a pipeline wait through freeride's own WaitTracker with
the chosen edge mode (`--edge-sync stream|event|off|all`: each mode is a configuration of its own,
run back to back). The wait stands for the neighbour's send, in one of two ways (`--neighbour`):

- `gpu` (the default): it stalls the stage's stream for the gap (`torch.cuda._sleep`, calibrated),
  as an NCCL receive does: the data lands `gap` after the stream reached the receive, and the CPU
  runs on queueing the kernels after it. A mode that makes the CPU wait for the GPU pays for it here.
- `cpu`: the CPU waits for the stage's GPU to drain, then sleeps the gap (the first GPU run's
  replay). Every mode's CPU waits anyway, so the cost of `stream`'s synchronisations is hidden.

`--device cpu` runs the same replay on CPU as a smoke test: its numbers say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from freeride.core.stats import percentile
from freeride.errors import FreerideError
from freeride.tooling import trace as tr
from freeride.tooling.harness import AgentProcess, WindowCollector, grant_latencies_us, wait_for_task
from freeride.trainer.edges import DEFAULT_EDGE_MODE, EDGE_MODES
from freeride.v1 import tasks_pb2

_LEARN = 2  # reported iterations the agent needs before it grants windows


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
    p.add_argument("--iterations", type=int, default=0, help="training iterations (default 40 cuda, 10 cpu)")
    p.add_argument("--side-task", default="freeride.tooling.tasks:MatmulTask",
                   help="side task reference (e.g. sidetasks.cnn:DigitsResNet); default a synthetic matmul task")
    p.add_argument("--side-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="argument for the side task (repeatable); the synthetic task takes step_ms and size")
    p.add_argument("--side-step-ms", type=float, default=2.0, help="step time of the synthetic side task")
    p.add_argument("--mps", choices=["off", "start", "both"], default="both",
                   help="run without MPS, with an MPS daemon the agent starts, or both (cuda only)")
    p.add_argument("--mps-control", default="nvidia-cuda-mps-control", help="MPS control program")
    p.add_argument("--edge-sync", choices=[*EDGE_MODES, "all"], default=DEFAULT_EDGE_MODE,
                   help="how the trainer takes bubble edges on CUDA (see instrument(edge_sync=...)); all: each "
                        "mode in turn. On cpu always off")
    p.add_argument("--neighbour", choices=["gpu", "cpu", "both"], default="gpu",
                   help="how a wait stands for the neighbour's send on cuda: gpu stalls the stream for the gap "
                        "(as an NCCL receive does; the CPU runs ahead), cpu waits for the GPU to drain and sleeps "
                        "the gap; both: each in turn. On cpu always cpu")


def run(ns: argparse.Namespace) -> dict[str, Any]:
    _check_device(ns.device)
    if not 0 <= ns.stage < ns.stages:
        raise NeedsGpuError(f"--stage must be in 0..{ns.stages - 1}")
    cpu = ns.device == "cpu"
    shape = {
        "hidden": ns.hidden or (256 if cpu else 4096),
        "seq": ns.seq or (64 if cpu else 2048),
        "micro_batch_size": ns.micro_batch_size,
        "layers": ns.layers or (1 if cpu else 4),
    }
    shape["heads"] = ns.heads or max(1, shape["hidden"] // 128)
    iterations = ns.iterations or (10 if cpu else 40)
    modes = ["off"] if cpu else {"off": ["off"], "start": ["start"], "both": ["off", "start"]}[ns.mps]
    side_args = dict(kv.split("=", 1) for kv in ns.side_arg if "=" in kv)
    if ns.side_task.endswith(":MatmulTask"):
        side_args.setdefault("step_ms", str(ns.side_step_ms))
        side_args.setdefault("size", "256" if cpu else "4096")
    edges = ["off"] if cpu else (list(EDGE_MODES) if ns.edge_sync == "all" else [ns.edge_sync])
    neighbours = ["cpu"] if cpu else (["gpu", "cpu"] if ns.neighbour == "both" else [ns.neighbour])
    runs = [{"mps": mode, "neighbour": nb, "edge_sync": edge,
             **_run_config(ns, mode, edge, nb, shape, iterations, side_args)}
            for mode in modes for nb in neighbours for edge in edges]
    device_name = runs[0]["device_name"]
    for r in runs:
        del r["device_name"]

    def first_run(mps: str) -> dict[str, Any]:
        """The figures of this MPS mode's first edge mode, without the mode itself."""
        return {k: v for k, v in next(r for r in runs if r["mps"] == mps).items() if k != "mps"}

    out: dict[str, Any] = {
        "benchmark": "overhead",
        "device": ns.device,
        "device_name": device_name,
        "representative": not cpu,
        "note": "CPU smoke test: not representative of a GPU" if cpu else "",
        "schedule": "1F1B", "p": ns.stages, "m": ns.microbatches, "stage": ns.stage, **shape,
        "iterations": iterations, "side_task": ns.side_task, "side_args": side_args,
        "mps": modes[0], **first_run(modes[0]), "runs": runs,
    }
    if "start" in modes and modes[0] != "start":
        out["with_mps"] = first_run("start")
    return out


def _check_device(device: str) -> None:
    try:
        import torch
    except ImportError:
        raise NeedsGpuError("freeride bench overhead needs torch (pip install 'freeride[torch]')") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise NeedsGpuError("freeride bench overhead needs a CUDA GPU and none is visible; "
                            "--device cpu runs it as a smoke test that is not representative")


def _run_config(ns: argparse.Namespace, mode: str, edge: str, neighbour: str, shape: dict[str, int],
                iterations: int, side_args: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="frbench-", dir="/tmp") as tmp:
        root = Path(tmp)
        extra = ["--headroom", "0"]
        env = dict(os.environ)
        if mode == "start":
            pipe = root / "mps" / "pipe"
            extra += ["--mps", "start", "--mps-control", ns.mps_control, "--mps-pipe-dir", str(pipe),
                      "--mps-log-dir", str(root / "mps" / "log")]
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)  # the trainer joins the daemon at normal priority
            env["CUDA_MPS_LOG_DIRECTORY"] = str(root / "mps" / "log")
        with AgentProcess(state_dir=root / "state", extra_args=extra) as agent, agent.client() as client:
            task = client.submit(tasks_pb2.TaskSpec(name="side", ref=ns.side_task, args=side_args))
            wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY], timeout_s=300)
            with WindowCollector(client) as collector:
                plan = {"target": agent.target, "device": ns.device, "p": ns.stages, "m": ns.microbatches,
                        "stage": ns.stage, "iterations": iterations, "edge_sync": edge, "neighbour": neighbour,
                        **shape}
                res = subprocess.run([sys.executable, "-m", "freeride.tooling.bench.overhead", json.dumps(plan)],
                                     env=env, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    raise FreerideError(f"the trainer replay failed: {res.stderr.strip().splitlines()[-1:]}")
                trainer = json.loads(res.stdout.strip().splitlines()[-1])
                harvested_its = [i for i in range(iterations) if i % 2 == 1][_LEARN:]
                collector.wait_for_all(client, 5.0)  # the replay has exited: its trainer stream is ending
                windows = list(collector.windows)
            info = client.get(task.id)
    return _summarise(trainer, windows, harvested_its, info)


def _summarise(trainer: dict[str, Any], windows: list[tasks_pb2.WindowRecord], harvested_its: list[int],
               info: tasks_pb2.TaskInfo) -> dict[str, Any]:
    steps = trainer["step_ms"]
    n = len(steps)
    plain = [steps[i] for i in range(_LEARN, n) if i % 2 == 0]
    harvested = [steps[i] for i in harvested_its]
    # Each harvested step against the mean of the plain steps on either side: slow drifts cancel.
    paired = [steps[i] / ((steps[i - 1] + steps[i + 1]) / 2) for i in harvested_its if i + 1 < n]
    # The first harvested iteration is the worker's first steps: CUDA context, allocator, kernel warm-up.
    wanted = set(harvested_its)
    bubble_s = sum((e - s) / 1e9 for it, _, s, e in trainer["bubbles"] if it in wanted)
    trace_bubble_s = sum(trainer["trace_bubble_s"][i] for i in harvested_its)  # the gaps the replay made
    mine = [w for w in windows if w.iteration in wanted]
    harvested_s = sum((sh.busy_ns - sh.overrun_ns) / 1e9 for w in mine for sh in w.shares)
    # After END (the trainer needs the GPU back), how long the side task's work kept running.
    tails_ms = [max(0.0, (sh.idle_ns - w.bubble_end_ns) / 1e6) for w in mine for sh in w.shares if sh.steps]
    grant_us = grant_latencies_us(mine)
    return {
        "device_name": trainer["device_name"],
        "F_ms": round(trainer["F_ms"], 3), "B_ms": round(trainer["B_ms"], 3),
        "neighbour_sleep_ghz": round(trainer["sleep_cycles_per_s"] / 1e9, 3),  # 0: the CPU sleeps the gaps
        "step_ms_plain": round(statistics.median(plain), 3) if plain else 0.0,
        "step_ms_harvested": round(statistics.median(harvested), 3) if harvested else 0.0,
        "slowdown": round(statistics.median(paired) - 1, 5) if paired else 0.0,
        "slowdown_first_harvested": round(paired[0] - 1, 5) if paired else 0.0,
        "bubble_s": round(bubble_s, 4),
        "harvested_s": round(harvested_s, 4),
        "efficiency": round(harvested_s / bubble_s, 4) if bubble_s else 0.0,
        # Against the gaps themselves: what the edges' mode found of them does not enter (`off` on a GPU
        # neighbour finds next to nothing).
        "trace_bubble_s": round(trace_bubble_s, 4),
        "efficiency_of_trace": round(harvested_s / trace_bubble_s, 4) if trace_bubble_s else 0.0,
        "side_steps": sum(sh.steps for w in mine for sh in w.shares),
        "stop_after_end_ms_p50": round(percentile(tails_ms, 0.5), 3) if tails_ms else 0.0,
        "stop_after_end_ms_p99": round(percentile(tails_ms, 0.99), 3) if tails_ms else 0.0,
        "stop_after_end_ms_max": round(max(tails_ms), 3) if tails_ms else 0.0,
        "grant_us_p50": round(percentile(grant_us, 0.5), 1) if grant_us else 0.0,
        "windows": len(mine),
        "side_task_state": tasks_pb2.TaskState.Name(info.state),
        "side_task_peak_memory_bytes": info.counters.peak_memory_bytes,
    }


# -- the trainer process ---------------------------------------------------------------------------
def _replay(plan: dict[str, Any]) -> dict[str, Any]:
    """Build the stage, time F and B, then replay its 1F1B timeline with real kernels (odd iterations reported)."""
    import torch

    from freeride.trainer.edges import clock_for
    from freeride.trainer.reporter import BubbleReporter
    from freeride.trainer.waits import FWD, WaitTracker

    dev = torch.device("cuda:0" if plan["device"] == "cuda" else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)  # one core for the stage, the other for the agent and the side task
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    h = plan["hidden"]
    block = torch.nn.Sequential(*[
        torch.nn.TransformerEncoderLayer(h, plan["heads"], 4 * h, dropout=0.0, batch_first=True, norm_first=True)
        for _ in range(plan["layers"])
    ]).to(dev, dtype)
    x = torch.randn(plan["micro_batch_size"], plan["seq"], h, device=dev, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    inflight: list[Any] = []

    def forward() -> None:
        inflight.append(block(x.requires_grad_()))

    def backward() -> None:
        y = inflight.pop(0)
        y.backward(torch.ones_like(y))

    f_ms = _time_ms(forward, 3, sync)
    b_ms = _time_ms(backward, 3, sync, prepare=forward)
    stage_trace = tr.generate("1f1b", plan["p"], plan["m"], f_ms, b_ms, 0.0, plan["iterations"])[plan["stage"]]
    reporter = BubbleReporter(plan["target"], rank=plan["stage"], stage=plan["stage"])
    if not reporter.wait_connected(10):
        raise RuntimeError("the reporter could not connect to the agent")
    clock = clock_for(dev, plan.get("edge_sync", DEFAULT_EDGE_MODE))
    tracker = WaitTracker(reporter, clock, record=True, min_report_ns=0)
    on_gpu = dev.type == "cuda" and plan.get("neighbour", "gpu") == "gpu"
    drained = torch.cuda.Event(blocking=True) if dev.type == "cuda" and not on_gpu else None
    cycles_per_s = _sleep_rate(torch) if on_gpu else 0.0

    def neighbour(gap_s: float) -> None:
        """The receive: its data arrives gap_s after this stage's GPU has drained (the trace's timeline)."""
        if on_gpu:  # the stream waits, the CPU goes on (an NCCL receive)
            torch.cuda._sleep(max(1, round(gap_s * cycles_per_s)))
            return
        if drained is not None:
            drained.synchronize()
        _sleep_s(gap_s)

    steps = []
    trace_bubble_s = [sum(seg.duration_s for seg in segments if seg.bubble) for segments in stage_trace]
    try:
        for it, segments in enumerate(stage_trace):
            tracker.enabled = it % 2 == 1
            if tracker.enabled:
                tracker.iteration = it - 1  # the edges carry the replay's iteration numbers
                tracker.begin_step()  # numbers this iteration's waits; no between-steps gap in this replay
            else:
                tracker.skip_step()
            t0 = time.monotonic_ns()
            for seg in segments:
                if seg.bubble:
                    if drained is not None:
                        drained.record()
                    if tracker.enabled:
                        tracker.wait(FWD, functools.partial(neighbour, seg.duration_s))
                    else:
                        neighbour(seg.duration_s)
                elif abs(seg.duration_s * 1e3 - f_ms) <= abs(seg.duration_s * 1e3 - b_ms):
                    forward()
                else:
                    backward()
            sync()
            steps.append((time.monotonic_ns() - t0) / 1e6)
    finally:
        tracker.close()
        reporter.close()
    bubbles = [(b.iteration, b.slot, b.start_ns, b.end_ns) for b in tracker.bubbles]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {"device_name": name, "F_ms": f_ms, "B_ms": b_ms, "step_ms": steps, "bubbles": bubbles,
            "trace_bubble_s": trace_bubble_s, "edge_sync": tracker.edge_mode, "sleep_cycles_per_s": cycles_per_s}


def _sleep_rate(torch: Any) -> float:
    """GPU clock cycles a second of `torch.cuda._sleep` (which spins for a number of cycles): median of 5,
    timed with CUDA events after a warm-up."""
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        rates.append(10_000_000 / (start.elapsed_time(end) / 1e3))
    return statistics.median(rates)


def _time_ms(fn: Any, n: int, sync: Any, prepare: Any = None) -> float:
    out = []
    for _ in range(n + 1):
        if prepare is not None:
            prepare()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out[1:])  # the first call pays for allocator and kernel selection


def _sleep_s(duration_s: float) -> None:
    if duration_s > 0:
        time.sleep(duration_s)


if __name__ == "__main__":
    print(json.dumps(_replay(json.loads(sys.argv[1]))))

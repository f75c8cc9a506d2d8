"""A real multi-process pipeline-parallel training run on CPU (torch.distributed.pipelining + gloo).

Each stage's compute is made deterministic in time (it sleeps F ms in forward and B ms in
backward around a real Linear + tanh), so the bubbles a schedule implies are known. Used by
the trainer benchmark and by the tests; run one rank with
`python -m freeride.bench.pipeline --rank R --world P --port N --config JSON --out FILE`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SINGLE = ("GPipe", "1F1B")
LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
SCHEDULES = SINGLE + LOOPED + V_SHAPED


@dataclass(frozen=True)
class PipelineConfig:
    schedule: str = "1F1B"
    stages: int = 4  # ranks per pipeline
    data_parallel: int = 1  # pipelines side by side (torch only): world = stages * data_parallel
    microbatches: int = 4
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    iterations: int = 6
    dim: int = 32
    microbatch_size: int = 2
    seed: int = 0
    instrument: bool = False
    socket_dir: str = ""  # agents' sockets (agent-gpu<LOCAL_RANK>.sock) when instrumenting
    record: bool = True
    alternate: bool = False  # instrument odd iterations only: plain and instrumented steps in one run
    framework: str = "torch"  # or "deepspeed" (its PipelineEngine, 1F1B TrainSchedule)

    def stage_ids(self, rank: int) -> list[int]:
        if self.schedule in SINGLE:
            return [rank]
        if self.schedule in LOOPED:
            return [rank, rank + self.stages]
        return [rank, 2 * self.stages - 1 - rank]

    @property
    def num_stages(self) -> int:
        return self.stages if self.schedule in SINGLE else 2 * self.stages


def _make_block(dim: int, forward_s: float, backward_s: float) -> Any:
    import torch

    class Sleep(torch.autograd.Function):
        """Stands for a stage's compute: a fixed time in forward and in backward."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            time.sleep(forward_s)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(backward_s)
            return grad

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(dim, dim)

        def forward(self, x: Any) -> Any:
            return torch.tanh(Sleep.apply(self.linear(x)))  # after a parameter: in the graph on every stage

    return Block()


def _result(rank: int, stage_ids: list[int], losses: list[float], params: list[Any], step_ns: list[int],
            inst: Any) -> dict[str, Any]:
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().numpy().tobytes())
    result: dict[str, Any] = {
        "rank": rank,
        "stage_ids": stage_ids,
        "losses": losses,
        "params_sha256": digest.hexdigest(),
        "step_ms": [s / 1e6 for s in step_ns],
        "bubbles": [],
        "reporter_dropped": 0,
    }
    if inst is not None:
        result["bubbles"] = [asdict(b) for b in inst.bubbles]
        result["reporter_dropped"] = inst.reporter.dropped
        inst.close()
    return result


def run_rank_deepspeed(rank: int, world: int, cfg: PipelineConfig) -> dict[str, Any]:
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(cfg.seed)
    layers = [_make_block(cfg.dim, cfg.forward_ms / 1e3, cfg.backward_ms / 1e3) for _ in range(world)]
    net = PipelineModule(layers=layers, num_stages=world, loss_fn=torch.nn.functional.mse_loss,
                         partition_method="uniform")
    ds_config = {
        "train_batch_size": cfg.microbatches * cfg.microbatch_size,
        "train_micro_batch_size_per_gpu": cfg.microbatch_size,
        "gradient_accumulation_steps": cfg.microbatches,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "steps_per_print": 10**9,
    }
    params = [p for p in net.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=ds_config)
    inst = None
    if cfg.instrument:
        from freeride.trainer.deepspeed import instrument

        inst = instrument(engine, record=cfg.record)
        inst.reporter.wait_connected(10)

    def batches(it: int) -> Any:
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + it)
        for _ in range(cfg.microbatches):
            yield torch.randn(cfg.microbatch_size, cfg.dim, generator=gen), torch.randn(
                cfg.microbatch_size, cfg.dim, generator=gen
            )

    losses: list[float] = []
    step_ns: list[int] = []
    for it in range(cfg.iterations):
        if inst is not None and cfg.alternate:
            inst.tracker.enabled = it % 2 == 1
        t0 = time.monotonic_ns()
        loss = engine.train_batch(iter(batches(it)))
        step_ns.append(time.monotonic_ns() - t0)
        losses.append(float(loss))
    result = _result(rank, [engine.stage_id], losses if engine.is_last_stage() else [], params, step_ns, inst)
    dist.barrier()
    return result


def run_rank(rank: int, world: int, cfg: PipelineConfig) -> dict[str, Any]:
    if cfg.framework == "deepspeed":
        return run_rank_deepspeed(rank, world, cfg)
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(cfg.seed)
    device = torch.device("cpu")
    # Ranks [d*P, (d+1)*P) form pipeline d; ranks with the same stage across pipelines form a DP group.
    replica, pp_rank = divmod(rank, cfg.stages)
    pp_groups = [dist.new_group(list(range(d * cfg.stages, (d + 1) * cfg.stages))) for d in range(cfg.data_parallel)]
    dp_groups = [dist.new_group(list(range(s, world, cfg.stages))) for s in range(cfg.stages)]
    pp_group = pp_groups[replica] if cfg.data_parallel > 1 else None
    dp_group = dp_groups[pp_rank] if cfg.data_parallel > 1 else None
    # Build every stage's module from one seed so weights do not depend on the rank layout.
    modules = [_make_block(cfg.dim, cfg.forward_ms / 1e3, cfg.backward_ms / 1e3) for _ in range(cfg.num_stages)]
    stage_ids = cfg.stage_ids(pp_rank)
    stages = [pipelining.PipelineStage(modules[s], s, cfg.num_stages, device, group=pp_group) for s in stage_ids]
    params = [p for s in stage_ids for p in modules[s].parameters()]
    optimizer = torch.optim.SGD(params, lr=0.05)
    cls = pipelining.schedules.get_schedule_class(cfg.schedule)
    kwargs: dict[str, Any] = {"loss_fn": torch.nn.functional.mse_loss}
    schedule = cls(stages[0] if cfg.schedule in SINGLE else stages, cfg.microbatches, **kwargs)
    inst = None
    if cfg.instrument:
        from freeride.trainer.torch_pipelining import instrument

        inst = instrument(schedule, record=cfg.record)
        inst.reporter.wait_connected(10)
    has_first = 0 in stage_ids
    has_last = cfg.num_stages - 1 in stage_ids
    losses: list[float] = []
    step_ns: list[int] = []
    batch = cfg.microbatches * cfg.microbatch_size
    for it in range(cfg.iterations):
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + it * cfg.data_parallel + replica)
        x = torch.randn(batch, cfg.dim, generator=gen)
        target = torch.randn(batch, cfg.dim, generator=gen)
        if inst is not None and cfg.alternate:
            inst.enabled = it % 2 == 1
        optimizer.zero_grad()
        mb_losses: list[Any] = []
        t0 = time.monotonic_ns()
        args = (x,) if has_first else ()
        schedule.step(*args, target=target if has_last else None, losses=mb_losses if has_last else None)
        if dp_group is not None:  # data parallelism: average the gradients of the replicas
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= cfg.data_parallel
        optimizer.step()
        step_ns.append(time.monotonic_ns() - t0)
        if has_last:
            losses.append(float(torch.stack(mb_losses).sum()))
    result = _result(rank, stage_ids, losses, params, step_ns, inst)
    dist.barrier()
    dist.destroy_process_group()
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(cfg: PipelineConfig, out_dir: Path, timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """Run all ranks as separate processes; return each rank's result (rank order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    world = cfg.stages * cfg.data_parallel
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
        if cfg.socket_dir:
            env["FREERIDE_SOCKET_DIR"] = cfg.socket_dir
        log = open(out_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed after the process ends
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "freeride.bench.pipeline", "--rank", str(rank), "--world", str(world),
             "--config", json.dumps(asdict(cfg)), "--out", str(out_dir / f"rank{rank}.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        ), log))
    deadline = time.monotonic() + timeout_s
    failed = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            code = proc.wait()
        log.close()
        if code != 0:
            failed.append(rank)
    if failed:
        tails = "\n".join(
            f"rank {r}: " + (out_dir / f"rank{r}.log").read_text(errors="replace")[-2000:] for r in failed
        )
        raise RuntimeError(f"pipeline ranks {failed} failed:\n{tails}")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="freeride-pipeline-rank")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--out", type=Path, required=True)
    ns = p.parse_args(argv)
    cfg = PipelineConfig(**json.loads(ns.config))
    result = run_rank(ns.rank, ns.world, cfg)
    ns.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

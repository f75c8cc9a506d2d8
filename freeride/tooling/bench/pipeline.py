"""A real multi-process pipeline-parallel training run on CPU (torch.distributed.pipelining + gloo).

With `model="sleep"` each stage's compute is made deterministic in time (it sleeps F ms in
forward and B ms in backward around a real Linear + tanh), so the bubbles a schedule implies
are known: the trainer benchmark and the tests use it. With `model="mlp"` each stage is
`layers_per_stage` Linear + ReLU layers of width `dim`, the shape of DeepSpeedExamples' pipeline
clients: real CPU compute and short bubbles. With `model="transformer"` the stages
are a small byte-level language model learning standard-library source (freeride.tooling.bench.lm):
real compute, for the demo. Run one rank with
`python -m freeride.tooling.bench.pipeline --rank R --world P --config JSON --out FILE`, or every rank forked from one
process that imported torch (and the framework) once: `... --fork-world --world P --config JSON --out-dir DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

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
    alternate: bool = False  # instrument odd blocks only: plain and instrumented steps in one run
    block: int = 1  # iterations per block when alternating
    quiet_sample_ms: float = 0.0  # DeepSpeed: a quiet agent's CPU stage times one step this often (0: each)
    warmup: int = 0  # iterations run instrumented before the alternation starts (the agent learns slots)
    framework: str = "torch"  # or "deepspeed" (its PipelineEngine, 1F1B TrainSchedule)
    model: str = "sleep"  # "mlp" or "transformer" (freeride.tooling.bench.lm): forward_ms/backward_ms unused
    layers_per_stage: int = 2  # mlp and transformer; heads and seq_len are the transformer's (dim: the width)
    heads: int = 4
    seq_len: int = 64
    device: str = "cpu"  # "cuda": each rank on GPU LOCAL_RANK (mod the GPU count), NCCL between ranks
    bubble_path: str = ""  # the ranks' $FREERIDE_BUBBLE_PATH ("auto" or "grpc"); "": the environment's
    cpus: tuple[int, ...] = ()  # rank r runs on CPU cpus[r % len(cpus)] (the demo: one core per stage); (): any
    wait_connected: bool = True  # DeepSpeed: wait for the reporter's connection before the first step (False: as a
    # real job does, it trains at once; the start-up bench measures that)

    def stage_ids(self, rank: int) -> list[int]:
        if self.schedule in SINGLE:
            return [rank]
        if self.schedule in LOOPED:
            return [rank, rank + self.stages]
        return [rank, 2 * self.stages - 1 - rank]

    @property
    def num_stages(self) -> int:
        return self.stages if self.schedule in SINGLE else 2 * self.stages

    def instrumented(self, iteration: int) -> bool:
        """Whether this iteration reports its bubbles (always, unless alternating)."""
        if not self.alternate or iteration < self.warmup:
            return True
        return (iteration - self.warmup) // self.block % 2 == 1


_slept_ns = [0]  # this rank's sleep model: the compute it really slept (a sleep overshoots on a loaded machine)


def _sleep(seconds: float) -> None:
    t0 = time.monotonic_ns()
    time.sleep(seconds)
    _slept_ns[0] += time.monotonic_ns() - t0


def _make_block(dim: int, forward_s: float, backward_s: float) -> Any:
    import torch

    class Sleep(torch.autograd.Function):
        """Stands for a stage's compute: a fixed time in forward and in backward."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            _sleep(forward_s)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            _sleep(backward_s)
            return grad

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(dim, dim)

        def forward(self, x: Any) -> Any:
            return torch.tanh(Sleep.apply(self.linear(x)))  # after a parameter: in the graph on every stage

    return Block()


def _make_mlp(dim: int, layers: int) -> Any:
    """One stage of real compute: `layers` Linear + ReLU layers of width `dim`."""
    import torch

    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(dim, dim), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def _stage_modules(cfg: PipelineConfig, count: int) -> list[Any]:
    """The `count` stages' modules of the sleep or mlp model, built in order from the current seed."""
    if cfg.model == "mlp":
        return [_make_mlp(cfg.dim, cfg.layers_per_stage) for _ in range(count)]
    return [_make_block(cfg.dim, cfg.forward_ms / 1e3, cfg.backward_ms / 1e3) for _ in range(count)]


def _result(rank: int, stage_ids: list[int], losses: list[float], params: list[Any], step_ns: list[int],
            inst: Any, step_start_ns: list[int] | None = None, reporter_path: str = "",
            step_cpu_ns: list[int] | None = None, compute_ns: list[int] | None = None,
            step_process_cpu_ns: list[int] | None = None, instrument_ns: int = 0) -> dict[str, Any]:
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().cpu().numpy().tobytes())
    result: dict[str, Any] = {
        "rank": rank,
        "stage_ids": stage_ids,
        "losses": losses,
        "params_sha256": digest.hexdigest(),
        "step_ms": [s / 1e6 for s in step_ns],
        "step_cpu_ms": [s / 1e6 for s in step_cpu_ns or []],  # the training thread's CPU time in each step
        # the whole process's (every thread: the reporter's, gRPC's), each step; and instrument()'s own wall time
        "step_process_cpu_ms": [s / 1e6 for s in step_process_cpu_ns or []],
        "instrument_ms": instrument_ns / 1e6,
        "compute_ms": [s / 1e6 for s in compute_ns or []],  # the sleep model's compute, as really slept, each step
        "step_start_ns": step_start_ns or [],
        "bubbles": [],
        "reporter_dropped": 0,
        "reporter_path": reporter_path,  # "shm" or "grpc" once connected ("" when not instrumented or unconnected)
        "reporter_wakes": 0,  # eventfd writes to the agent (the ring road): none while it has nothing to grant
        "untimed_steps": 0,  # instrumented steps a quiet agent let run untimed (WaitTracker.timed)
    }
    if inst is not None:
        inst.undo()  # first: the tracker writes (and records) what quiet steps kept
        result["bubbles"] = [asdict(b) for b in inst.bubbles]
        result["reporter_dropped"] = inst.reporter.dropped
        result["reporter_wakes"] = inst.reporter.wakes
        result["untimed_steps"] = inst.tracker.untimed_steps
        inst.reporter.close()
    return result


def run_rank_deepspeed(rank: int, world: int, cfg: PipelineConfig) -> dict[str, Any]:
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule

    if cfg.device == "cpu":
        import deepspeed.ops

        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (g++, about a minute on two cores)
        # on the first run in each environment. These runs never use it, so they go without it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(cfg.seed)
    layers = _stage_modules(cfg, world)
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
    reporter_path = ""
    instrument_ns = 0
    if cfg.instrument:
        i0 = time.monotonic_ns()
        from freeride.trainer.deepspeed import instrument

        inst = instrument(engine, record=cfg.record, quiet_sample_ms=cfg.quiet_sample_ms)
        instrument_ns = time.monotonic_ns() - i0
        if cfg.wait_connected:
            inst.reporter.wait_connected(10)
        reporter_path = inst.reporter.path

    def batches(it: int) -> Any:
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + it)
        for _ in range(cfg.microbatches):
            yield torch.randn(cfg.microbatch_size, cfg.dim, generator=gen), torch.randn(
                cfg.microbatch_size, cfg.dim, generator=gen
            )

    losses: list[float] = []
    step_ns: list[int] = []
    step_cpu_ns: list[int] = []
    step_process_cpu_ns: list[int] = []
    compute_ns: list[int] = []
    for it in range(cfg.iterations):
        if inst is not None:
            inst.tracker.enabled = cfg.instrumented(it)
        slept = _slept_ns[0]
        p0 = time.process_time_ns()
        c0 = time.thread_time_ns()
        t0 = time.monotonic_ns()
        loss = engine.train_batch(iter(batches(it)))
        step_ns.append(time.monotonic_ns() - t0)
        step_cpu_ns.append(time.thread_time_ns() - c0)
        step_process_cpu_ns.append(time.process_time_ns() - p0)
        compute_ns.append(_slept_ns[0] - slept)
        losses.append(float(loss))
    if inst is not None and not reporter_path:
        reporter_path = inst.reporter.path  # (not waited for: the road it took by the end)
    result = _result(rank, [engine.stage_id], losses if engine.is_last_stage() else [], params, step_ns, inst,
                     reporter_path=reporter_path, step_cpu_ns=step_cpu_ns, compute_ns=compute_ns,
                     step_process_cpu_ns=step_process_cpu_ns, instrument_ns=instrument_ns)
    dist.barrier()
    return result


def _device(cfg: PipelineConfig, rank: int) -> Any:
    import torch

    if cfg.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU")
    local = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device("cuda", local % torch.cuda.device_count())


def run_rank(rank: int, world: int, cfg: PipelineConfig, progress: IO[str] | None = None) -> dict[str, Any]:
    if cfg.framework == "deepspeed":
        return run_rank_deepspeed(rank, world, cfg)
    return run_rank_series(rank, world, [cfg], progress)[0]


def run_rank_series(rank: int, world: int, cfgs: list[PipelineConfig],
                    progress: IO[str] | None = None) -> list[dict[str, Any]]:
    """Train each configuration in turn in one process group (torch only; the same world for all): a test of many
    schedules pays torch's import and the group's start once. Each is seeded, built and instrumented afresh."""
    import torch
    import torch.distributed as dist

    device = _device(cfgs[0], rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    results = []
    for cfg in cfgs:
        results.append(_train(rank, world, cfg, device, progress))
        dist.barrier()
    dist.destroy_process_group()
    return results


def _train(rank: int, world: int, cfg: PipelineConfig, device: Any, progress: IO[str] | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    from freeride.tooling.bench import lm

    torch.manual_seed(cfg.seed)
    # Ranks [d*P, (d+1)*P) form pipeline d; ranks with the same stage across pipelines form a DP group.
    replica, pp_rank = divmod(rank, cfg.stages)
    pp_groups = [dist.new_group(list(range(d * cfg.stages, (d + 1) * cfg.stages))) for d in range(cfg.data_parallel)]
    dp_groups = [dist.new_group(list(range(s, world, cfg.stages))) for s in range(cfg.stages)]
    pp_group = pp_groups[replica] if cfg.data_parallel > 1 else None
    dp_group = dp_groups[pp_rank] if cfg.data_parallel > 1 else None
    # Build every stage's module from one seed so weights do not depend on the rank layout.
    text = None
    if cfg.model == "transformer":
        modules = lm.build_stages(cfg.num_stages, cfg.layers_per_stage, cfg.dim, cfg.heads, cfg.seq_len)
        text = torch.frombuffer(bytearray(lm.corpus()), dtype=torch.uint8).long()
        loss_fn: Any = lm.loss_fn
        lr = 1e-3
    else:
        modules = _stage_modules(cfg, cfg.num_stages)
        loss_fn = torch.nn.functional.mse_loss
        lr = 0.05
    stage_ids = cfg.stage_ids(pp_rank)
    for s in stage_ids:
        modules[s].to(device)
    stages = [pipelining.PipelineStage(modules[s], s, cfg.num_stages, device, group=pp_group) for s in stage_ids]
    params = [p for s in stage_ids for p in modules[s].parameters()]
    optimizer: Any = torch.optim.AdamW(params, lr=lr) if text is not None else torch.optim.SGD(params, lr=lr)
    cls = pipelining.schedules.get_schedule_class(cfg.schedule)
    schedule = cls(stages[0] if cfg.schedule in SINGLE else stages, cfg.microbatches, loss_fn=loss_fn)
    inst = None
    reporter_path = ""
    if cfg.instrument:
        from freeride.trainer.torch_pipelining import instrument

        inst = instrument(schedule, record=cfg.record)
        inst.reporter.wait_connected(10)
        reporter_path = inst.reporter.path
    has_first = 0 in stage_ids
    has_last = cfg.num_stages - 1 in stage_ids
    losses: list[float] = []
    step_ns: list[int] = []
    step_cpu_ns: list[int] = []
    step_start_ns: list[int] = []
    compute_ns: list[int] = []
    batch = cfg.microbatches * cfg.microbatch_size
    for it in range(cfg.iterations):
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + it * cfg.data_parallel + replica)
        if text is not None:
            x, target = lm.batch(text, batch, cfg.seq_len, gen)
        else:
            x = torch.randn(batch, cfg.dim, generator=gen)
            target = torch.randn(batch, cfg.dim, generator=gen)
        x, target = x.to(device), target.to(device)
        if inst is not None:
            inst.enabled = cfg.instrumented(it)
        optimizer.zero_grad()
        mb_losses: list[Any] = []
        slept = _slept_ns[0]
        c0 = time.thread_time_ns()
        t0 = time.monotonic_ns()
        args = (x,) if has_first else ()
        schedule.step(*args, target=target if has_last else None, losses=mb_losses if has_last else None)
        if dp_group is not None:  # data parallelism: average the gradients of the replicas
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= cfg.data_parallel
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ns.append(time.monotonic_ns() - t0)
        step_cpu_ns.append(time.thread_time_ns() - c0)
        step_start_ns.append(t0)
        compute_ns.append(_slept_ns[0] - slept)
        if has_last:
            losses.append(float(torch.stack(mb_losses).sum()) / (cfg.microbatches if text is not None else 1))
        if progress is not None:
            progress.write(json.dumps({"iteration": it, "step_ms": step_ns[-1] / 1e6,
                                       "loss": losses[-1] if has_last else None}) + "\n")
            progress.flush()
    return _result(rank, stage_ids, losses, params, step_ns, inst, step_start_ns, reporter_path, step_cpu_ns,
                   compute_ns)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PipelineRun:
    """All ranks of one pipeline run as child processes, in a session of their own (a terminal's Ctrl-C reaches
    only the parent, which stops them in order). On a CPU the ranks are forked from one process that imported
    torch and the framework first (`fork`): a 4-rank run starts in about half the time on two cores, where each
    rank paid torch's import (3 s of CPU with its pipelining package); on a GPU each rank is its own interpreter. The
    last rank writes one JSON line per iteration to `progress` (a readable pipe end) when `watch` is set.
    `series`: more configurations the ranks train after `cfg`, in the same processes (`launch_series`)."""

    def __init__(self, cfg: PipelineConfig, out_dir: Path, watch: bool = False,
                 series: tuple[PipelineConfig, ...] = (), fork: bool | None = None) -> None:
        self.cfg = cfg
        self._series = series
        self.out_dir = out_dir
        self.world = cfg.stages * cfg.data_parallel
        self.fork = cfg.device == "cpu" if fork is None else fork
        self.procs: list[subprocess.Popen[bytes]] = []  # a process per rank, or the one the ranks are forked from
        self._logs: list[IO[bytes]] = []
        self.progress: IO[str] | None = None
        self._watch = watch

    def start(self) -> PipelineRun:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        read_fd = write_fd = -1
        if self._watch:
            read_fd, write_fd = os.pipe()
        try:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(self.world),
                       OMP_NUM_THREADS="1")
            if self.cfg.device == "cpu":
                env["DS_ACCELERATOR"] = "cpu"  # else DeepSpeed's own detection (an empty value is an error)
            if self.cfg.socket_dir:
                env["FREERIDE_SOCKET_DIR"] = self.cfg.socket_dir
            if self.cfg.bubble_path:
                env["FREERIDE_BUBBLE_PATH"] = self.cfg.bubble_path
            progress = ["--progress-fd", str(write_fd)] if write_fd >= 0 else []
            fds = (write_fd,) if write_fd >= 0 else ()
            module = [sys.executable, "-m", "freeride.tooling.bench.pipeline", "--world", str(self.world),
                      "--config", self._config_json()]
            if self.fork:
                (self.out_dir / "exits.json").unlink(missing_ok=True)  # a run's own, written when its ranks end
                self._spawn([*module, "--fork-world", "--out-dir", str(self.out_dir), *progress],
                            env, self.out_dir / "ranks.log", fds)
            for rank in range(self.world if not self.fork else 0):
                last = rank == self.world - 1
                self._spawn([*module, "--rank", str(rank), "--out", str(self.out_dir / f"rank{rank}.json"),
                             *(progress if last else [])],
                            dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), self.out_dir / f"rank{rank}.log",
                            fds if last else ())
        except BaseException:
            self.stop()
            raise
        finally:
            if write_fd >= 0:
                os.close(write_fd)  # the child holds its copy: EOF on the read end when it exits
        if read_fd >= 0:
            self.progress = os.fdopen(read_fd, "r")
        return self

    def _spawn(self, argv: list[str], env: dict[str, str], log_path: Path, fds: tuple[int, ...]) -> None:
        log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self._logs.append(log)
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, pass_fds=fds, start_new_session=True))

    def _config_json(self) -> str:
        if not self._series:
            return json.dumps(asdict(self.cfg))
        return json.dumps([asdict(c) for c in (self.cfg, *self._series)])

    def iterations(self) -> Iterator[dict[str, Any]]:
        """The last rank's per-iteration lines, as they come, until it exits."""
        if self.progress is None:
            return
        for line in self.progress:
            with contextlib.suppress(json.JSONDecodeError):
                yield json.loads(line)

    def wait(self, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Wait for every rank; each rank's result (rank order), or RuntimeError with the failed ranks' logs."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.stop(grace_s=0)
                codes.append(proc.wait())
        self._close()
        if self.fork:  # the forking process's own code says only whether all ranks exited 0; each rank's is kept
            exits = self.out_dir / "exits.json"
            codes = json.loads(exits.read_text()) if exits.exists() else [codes[0] or 1] * self.world
        failed = [rank for rank, code in enumerate(codes) if code != 0]
        if failed:
            tails = "\n".join(
                f"rank {r}: " + (self.out_dir / f"rank{r}.log").read_text(errors="replace")[-2000:]
                for r in failed if (self.out_dir / f"rank{r}.log").exists()
            )
            if self.fork:
                tails += "\n" + (self.out_dir / "ranks.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pipeline ranks {failed} failed:\n{tails}")
        return [json.loads((self.out_dir / f"rank{r}.json").read_text()) for r in range(self.world)]

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every rank still running, SIGKILL those that outlive `grace_s`, reap all."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._close()

    def _close(self) -> None:
        for log in self._logs:
            log.close()
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def __enter__(self) -> PipelineRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(cfg: PipelineConfig, out_dir: Path, timeout_s: float = 300.0,
           fork: bool | None = None) -> list[dict[str, Any]]:
    """Run all ranks as separate processes; return each rank's result (rank order). `fork`: PipelineRun's."""
    with PipelineRun(cfg, out_dir, fork=fork) as run:
        return run.wait(timeout_s)


def launch_series(cfgs: list[PipelineConfig], out_dir: Path, timeout_s: float = 300.0) -> list[list[dict[str, Any]]]:
    """Train each configuration in turn, in one set of rank processes (torch's import and the process group paid
    once); each configuration's result per rank (rank order). They must share what the processes are started with."""
    first, *rest = cfgs
    shared = ("stages", "data_parallel", "framework", "device", "socket_dir", "bubble_path", "cpus")
    differ = sorted({k for c in rest for k in shared if getattr(c, k) != getattr(first, k)})
    if first.framework != "torch":
        raise ValueError(f"a series runs torch configurations, not {first.framework}")
    if differ:
        raise ValueError(f"a series runs configurations that share {', '.join(shared)}; these differ: "
                         f"{', '.join(differ)}")
    if not rest:
        return [launch(first, out_dir, timeout_s)]
    with PipelineRun(first, out_dir, series=tuple(rest)) as run:
        per_rank: list[Any] = run.wait(timeout_s)  # each rank's file: its list, one result per configuration
    return [[ranks[i] for ranks in per_rank] for i in range(len(cfgs))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="freeride-pipeline-rank")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--progress-fd", type=int, default=-1, help="write one JSON line per iteration here")
    p.add_argument("--fork-world", action="store_true", help="fork every rank from this process, after torch's import")
    p.add_argument("--out-dir", type=Path, help="--fork-world: each rank's rankR.json and rankR.log, and exits.json")
    ns = p.parse_args(argv)
    raw = json.loads(ns.config)
    cfgs = [PipelineConfig(**{**r, "cpus": tuple(r.get("cpus", ()))}) for r in (raw if isinstance(raw, list)
                                                                                 else [raw])]
    if ns.fork_world:
        if ns.out_dir is None:
            p.error("--fork-world needs --out-dir")
        return _fork_world(ns.world, cfgs, raw, ns.out_dir, ns.progress_fd)
    if ns.rank is None or ns.out is None:
        p.error("a rank needs --rank and --out")
    return _rank_main(ns.rank, ns.world, cfgs, raw, ns.out, ns.progress_fd)


def _rank_main(rank: int, world: int, cfgs: list[PipelineConfig], raw: Any, out: Path, progress_fd: int) -> int:
    cfg = cfgs[0]
    if cfg.cpus:  # before torch starts its threads: they all inherit it
        os.sched_setaffinity(0, {cfg.cpus[rank % len(cfg.cpus)]})
    # SIGTERM from the parent: leave through KeyboardInterrupt, as on Ctrl-C, without a traceback.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    progress = os.fdopen(progress_fd, "w") if progress_fd >= 0 else None
    try:
        result: Any = (run_rank(rank, world, cfg, progress) if not isinstance(raw, list)
                       else run_rank_series(rank, world, cfgs, progress))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1  # the parent went away
    out.write_text(json.dumps(result))
    return 0


def _fork_world(world: int, cfgs: list[PipelineConfig], raw: Any, out_dir: Path, progress_fd: int) -> int:
    """Import torch (and the framework) once, fork every rank, wait for them all: exits.json holds each rank's exit
    code. A DataLoader's workers are forked after torch's import the same way; no process group, device or
    operation has started here (torch's thread pools start at the first operation)."""
    import torch
    import torch.distributed  # noqa: F401

    if cfgs[0].framework == "deepspeed":
        import deepspeed  # noqa: F401
    else:
        from torch.distributed import pipelining  # noqa: F401
    # A stop reaches every rank (one process group): this process waits for them and says how each ended.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for rank in range(world):
        last = rank == world - 1
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
                log = os.open(out_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                if progress_fd >= 0 and not last:
                    os.close(progress_fd)
                code = _rank_main(rank, world, cfgs, raw, out_dir / f"rank{rank}.json",
                                  progress_fd if last else -1)
            except BaseException:  # a rank's failure is its exit code and its log
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = rank
    if progress_fd >= 0:
        os.close(progress_fd)  # the last rank holds it: EOF when that rank exits
    codes = [1] * world
    while pids:
        pid, status = os.wait()
        if pid in pids:
            codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
    (out_dir / "exits.json").write_text(json.dumps(codes))
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())

"""One rank of a real Megatron-Core pipeline on CPU (gloo), run by
tests/integration/trainers/test_megatron_schedules.py.

    python megatron_rank.py SCHEDULE OUT.json     (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

SCHEDULE: "1f1b" (2 stages) or "interleaved" (2 stages of 2 virtual stages each). The rank trains the same tiny
model twice from the same seed, with Megatron's real `get_forward_backward_func()`: once plain, once with
`instrument(config)`, and writes both runs' losses and parameters, the timer calls Megatron made and the bubbles
freeride recorded.

The harness is what differs from a user's script on GPUs: `RecordingTimers` stands for Megatron's own Timers, and
`cpu_shims` answers Megatron's own CUDA calls, which a CPU-only torch refuses. megatron-core 0.16.1 makes three on
these paths: receive (and shape) buffers on `torch.cuda.current_device()` and a `torch.cuda.synchronize()` after a
batched receive (`batch_p2p_sync`) in p2p_communication.py, `total_num_tokens` on "cuda" in schedules.py (each
schedule). The shims give those two modules a `torch` whose CUDA calls land on the CPU; nothing else (torch
itself, freeride, the training code) sees them. The training code calls `instrument(config)` as on GPUs.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

SEQ, MICRO_BATCH, HIDDEN = 4, 2, 8
MICROBATCHES, ITERATIONS = 4, 3
COMPUTE_S = 0.003  # a few ms of "compute" per layer: the neighbour's waits are long enough to be reported


# -- the harness: what a CPU run needs from Megatron's own CUDA calls -------------------------------------------------
class _CpuCuda:
    """torch.cuda as Megatron's pipeline modules see it on a CPU rank."""

    @staticmethod
    def current_device() -> str:
        return "cpu"  # the device= of p2p_communication's receive (and shape) buffers

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass  # after a batched receive (batch_p2p_sync): gloo's wait has already returned with the data

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _CpuTorch(types.ModuleType):
    """torch, but for its `cuda` namespace and `zeros(device="cuda")` (schedules.py's total_num_tokens)."""

    cuda = _CpuCuda()

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


def cpu_shims() -> list[str]:
    """Point Megatron's pipeline modules at a CPU torch; the modules patched."""
    from megatron.core.pipeline_parallel import p2p_communication, schedules

    for module in (p2p_communication, schedules):
        module.torch = _CpuTorch()  # type: ignore[attr-defined]
    return [p2p_communication.__name__, schedules.__name__]


class RecordingTimers:
    """Stands for the user's own timers (Megatron's Timers): records every call; freeride must forward them all."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name: str, log_level: int | None = None) -> types.SimpleNamespace:
        return types.SimpleNamespace(start=lambda barrier=False: self.calls.append((name, "start")),
                                     stop=lambda barrier=False: self.calls.append((name, "stop")))


# -- the user's training script --------------------------------------------------------------------------------------
class Stage(torch.nn.Module):
    """A model chunk as Megatron's schedules want one: `config`, `model_type`, `set_input_tensor`."""

    def __init__(self, config: Any) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, tensors: list[torch.Tensor | None]) -> None:
        self.input_tensor = tensors[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.input_tensor is None else self.input_tensor  # the first stage reads the batch
        for layer in self.layers:
            time.sleep(COMPUTE_S)
            h = torch.tanh(layer(h))
        return h


def batches(seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=gen)
        yield x, torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=gen)


def forward_step(data_iterator: Iterator[tuple[torch.Tensor, torch.Tensor]], model: Stage) -> Any:
    x, target = next(data_iterator)

    def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = torch.nn.functional.mse_loss(output, target)
        return loss, {"loss": loss.detach()}

    return model(x), loss_func


def train(schedule: str, instrumented: bool) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    from freeride.trainer.megatron import instrument

    chunks = 2 if schedule == "interleaved" else 1
    # Megatron's model config (a ModelParallelConfig), as a GPT model gets it: the schedules read hidden_size
    config = TransformerConfig(num_layers=2 * 2 * chunks, hidden_size=HIDDEN, num_attention_heads=1,
                               pipeline_model_parallel_size=2,
                               virtual_pipeline_model_parallel_size=chunks if chunks > 1 else None,
                               pipeline_dtype=torch.float32)
    torch.manual_seed(0)
    model = [Stage(config) for _ in range(chunks)]
    optimizer = torch.optim.SGD([p for m in model for p in m.parameters()], lr=0.1)
    forward_backward = get_forward_backward_func()
    timers = RecordingTimers()
    config.timers = timers
    handle = instrument(config, record=True) if instrumented else None  # the agent of this rank's GPU (LOCAL_RANK)
    if handle is not None:
        assert handle.reporter.wait_connected(10), "no agent"
    losses: list[list[float]] = []
    steps: list[list[tuple[str, str]]] = []
    for it in range(ITERATIONS):
        optimizer.zero_grad()
        data = [batches(it) for _ in model]  # every chunk reads the same micro-batches (the last one, its targets)
        before = len(timers.calls)
        out = forward_backward(forward_step_func=forward_step, data_iterator=data if chunks > 1 else data[0],
                               model=model if chunks > 1 else model[0], num_microbatches=MICROBATCHES,
                               seq_length=SEQ, micro_batch_size=MICRO_BATCH)
        optimizer.step()
        steps.append(timers.calls[before:])
        losses.append([float(d["loss"]) for d in out])
    params = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for m in model for p in m.parameters()))
    result: dict[str, Any] = {"function": forward_backward.__name__, "losses": losses,
                              "params_sha256": params.hexdigest(), "timer_calls": steps,
                              "pipeline_rank": parallel_state.get_pipeline_model_parallel_rank()}
    if handle is not None:
        result["bubbles"] = [[b.iteration, b.slot, b.kind, b.reported, b.end_ns - b.start_ns] for b in handle.bubbles]
        handle.close()
        result["timers_restored"] = config.timers is timers
    return result


def main(argv: list[str]) -> None:
    """argv: the schedules, comma-separated, each trained in turn in this process; the output path, with
    `{schedule}` where each schedule's name goes."""
    schedules, out = argv[1].split(","), argv[2]
    dist.init_process_group("gloo")
    import megatron.core
    from megatron.core import parallel_state

    for schedule in schedules:  # one process for all: Megatron and torch imported once (5-6 CPU-s a rank)
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=2,
            virtual_pipeline_model_parallel_size=2 if schedule == "interleaved" else None)
        result: dict[str, Any] = {"megatron_core": megatron.core.__version__, "shimmed": cpu_shims()}
        result["plain"] = train(schedule, instrumented=False)
        result["instrumented"] = train(schedule, instrumented=True)
        with open(out.format(schedule=schedule), "w") as f:
            json.dump(result, f)
        dist.barrier()
        parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv)

"""`instrument(trainer.pp_schedule)` on the schedule torchtitan builds (README, "torchtitan"): 2 ranks, gloo, CPU.

torchtitan itself is not installed in CI (its dependencies, datasets, wandb, tensorboard and more, are large for
one test), so each rank builds its stages and schedule the way torchtitan 0.3.0 does:
`torchtitan.distributed.pipeline_parallel._pipeline_module_split` (a `PipelineStage` per stage index of this rank,
on the "pp" mesh's group, "loop" placement) and `_build_pipeline_schedule` (`get_schedule_class(name)`, then
`schedule_class(stages or stages[0], n_microbatches=..., loss_fn=<scalar of torchtitan's (loss, extra)>,
scale_grads=False[, backward_requires_autograd=True])`). Where torchtitan is importable, its own two functions are
used instead, and the result says which builder ran.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import Agents

from freeride.v1 import trainer_pb2

pytest.importorskip("torch")
pytestmark = pytest.mark.background  # counts of waits, in every step

RANKS, MICROBATCHES, ITERATIONS = 2, 4, 4

RANK = r'''
import inspect, json, os, sys, time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class

from freeride.trainer.torch_pipelining import instrument

name, out, MICROBATCHES, ITERATIONS = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
pp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))


def titan_loss(pred, target):  # torchtitan's LossFunction returns (loss, extra)
    return torch.nn.functional.mse_loss(pred, target), {}


try:  # torchtitan's own builder, where it is installed
    import torchtitan
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule, _get_pp_rank_to_stage_indices_mapping

    builder = f"torchtitan {torchtitan.__version__}"

    def build(stages):
        parallelism = ParallelismConfig(pipeline_parallel_degree=world, pipeline_parallel_schedule=name)
        # 0.3.0 derives the micro-batches from the local batch (micro-batches of 1 by default); its main branch
        # takes their number
        count = ("local_batch_size" if "local_batch_size" in inspect.signature(_build_pipeline_schedule).parameters
                 else "num_microbatches")
        return _build_pipeline_schedule(parallelism=parallelism, stages=stages, loss_fn=titan_loss,
                                        **{count: MICROBATCHES})
except ImportError:  # as torchtitan 0.3.0's _build_pipeline_schedule and _get_pp_rank_to_stage_indices_mapping do
    builder = "as torchtitan 0.3.0"

    def _get_pp_rank_to_stage_indices_mapping(pp_rank, pp_degree, pp_schedule, num_stages):
        return tuple(pp_rank + s * pp_degree for s in range(num_stages // pp_degree))  # the "loop" style

    def build(stages):
        schedule_class = get_schedule_class(name)

        def scalar_loss_fn(*args, **kwargs):
            loss, _ = titan_loss(*args, **kwargs)
            return loss

        if issubclass(schedule_class, PipelineScheduleMulti):
            return schedule_class(stages, n_microbatches=MICROBATCHES, loss_fn=scalar_loss_fn, scale_grads=False,
                                  backward_requires_autograd=True)
        return schedule_class(stages[0], n_microbatches=MICROBATCHES, loss_fn=scalar_loss_fn, scale_grads=False)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        time.sleep(0.004)  # a few ms of "compute": the waits it causes are long enough to be reported
        return self.lin(x)


stages_per_rank = 1 if not issubclass(get_schedule_class(name), PipelineScheduleMulti) else 2
num_stages = world * stages_per_rank
torch.manual_seed(0)
modules = [Block() for _ in range(num_stages)]
indices = _get_pp_rank_to_stage_indices_mapping(pp_mesh.get_local_rank(), pp_mesh.size(), name, num_stages)
stages = [PipelineStage(modules[i], i, num_stages, torch.device("cpu"), group=pp_mesh.get_group("pp"))
          for i in indices]
schedule = build(stages)
handle = instrument(schedule, record=True)  # the README's recipe: instrument(trainer.pp_schedule)
handle.reporter.wait_connected(60)  # at once, but on a starved CPU (the test may run at idle priority)
first, last = 0 in indices, num_stages - 1 in indices
for it in range(ITERATIONS):
    gen = torch.Generator().manual_seed(it)
    x, target = torch.randn(MICROBATCHES, 8, generator=gen), torch.randn(MICROBATCHES, 8, generator=gen)
    losses = [] if last else None
    schedule.step(*((x,) if first else ()), target=target if last else None, losses=losses, return_outputs=False)
bubbles = [[b.iteration, b.slot, b.kind, b.reported] for b in handle.bubbles]
result = {"builder": builder, "schedule": type(schedule).__name__, "scale_grads": schedule.scale_grads,
          "waits_seen": handle.tracker.waits_seen, "instrumented": "step" in vars(schedule), "bubbles": bubbles}
handle.close()
with open(out, "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def two_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    a = Agents(tmp_path_factory.mktemp("agents"), ranks=RANKS).start()
    try:
        yield a
    finally:
        a.stop()


def _run(script: Path, schedule: str, agents: Agents, out_dir: Path) -> list[dict[str, object]]:
    logs = agents.launch(lambda rank: [sys.executable, str(script), schedule, str(out_dir / f"rank{rank}.json"),
                                       str(MICROBATCHES), str(ITERATIONS)], out_dir)
    assert not any("saw no pipeline wait" in text for text in logs), logs
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])  # what a tester ran with torchtitan 0.3.0 on GPUs
def test_instrument_reports_the_waits_of_the_schedule_torchtitan_builds(
    schedule: str, two_agents: Agents, tmp_path: Path
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    seen_before = [c.stats().gpu.bubbles for c in two_agents.clients]
    results = _run(script, schedule, two_agents, tmp_path)
    print(f"builder: {results[0]['builder']}")  # which one ran: torchtitan's own, or its copy here
    for r, res in enumerate(results):
        assert res["schedule"] == f"Schedule{schedule}" and res["scale_grads"] is False
        assert res["instrumented"] and res["waits_seen"], (r, res)  # still attached after every step
        bubbles = res["bubbles"]
        assert isinstance(bubbles, list)
        waits = [b for b in bubbles if b[2] != trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS]
        assert {b[0] for b in waits} == set(range(ITERATIONS)), (r, waits)  # waits in every step
        reported = sum(b[3] for b in waits)
        assert reported > 0, (r, waits)
        assert two_agents.clients[r].stats().gpu.bubbles - seen_before[r] == reported  # each reached its rank's agent
    if schedule == "1F1B":
        kinds = {b[2] for b in results[1]["bubbles"]}  # type: ignore[union-attr]
        assert trainer_pb2.BUBBLE_KIND_FILL in kinds  # the last stage waits for the first activation

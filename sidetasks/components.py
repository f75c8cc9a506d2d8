"""Connected components of an R-MAT graph (edges taken as undirected) by min-label propagation.

Every vertex starts labelled with its own id; a sweep lowers each endpoint's label to the smaller
label across each edge (scatter-min over a block of edges), then shortcuts labels through their
label's label (label[v] <- label[label[v]], valid because a label is always a vertex of the same
component with a smaller or equal id). A sweep that changes nothing ends the task: every vertex
then carries the smallest id of its component. A step runs as many edge blocks as fit the bubble.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from freeride import IterativeTask, StepBudget
from sidetasks.graphs import rmat_edges


class ConnectedComponents(IterativeTask):
    """Labels every vertex with the smallest id in its component; progress: sweeps, changed labels, components."""

    # Measured peak resident set with the defaults (2^16 vertices, 955k edges): ~300 MiB; scale 18 ~680 MiB.
    # On a GPU the cap counts the CUDA context too (~600 MiB on an H200, CUDA 13.0): 1 GiB leaves room.
    mem_limit_bytes = 1024 * 2**20

    def __init__(self, scale: int = 16, edge_factor: int = 16, block_edges: int = 1 << 16, seed: int = 0,
                 device: str = "cpu", max_step_ms: float = 10.0) -> None:
        if block_edges < 1 or max_step_ms <= 0:
            raise ValueError("block_edges and max_step_ms must be positive")
        self.scale, self.edge_factor, self.block_edges, self.seed = scale, edge_factor, block_edges, seed
        self.device_arg = device
        self.budget = StepBudget(max_step_ms / 1e3)

    def setup(self) -> None:
        self.device = torch.device(self.context.device if self.device_arg == "auto" else self.device_arg)
        self.budget.track(self.device)  # on a GPU: one unit's kernels in flight at most
        src, dst = rmat_edges(self.scale, self.edge_factor, self.seed)
        self.n, self.m = 1 << self.scale, len(src)
        self.src = torch.from_numpy(src).to(self.device)
        self.dst = torch.from_numpy(dst).to(self.device)
        self.block_count = max(1, -(-self.m // self.block_edges))
        self.labels = torch.arange(self.n, dtype=torch.int64, device=self.device)
        self.sweeps = 0
        self.changed = self.n
        self.converged = False
        self.components = self.n
        self._begin_sweep()
        k = min(1024, self.m)  # warm-up: the first scatter is several times slower than the rest
        torch.empty_like(self.labels).scatter_reduce_(0, self.src[:k], self.labels[:k], reduce="amin")

    def _begin_sweep(self) -> None:
        self.block = 0
        self._before = self.labels.clone()

    def _propagate_block(self) -> None:
        lo = self.block * self.block_edges
        src, dst = self.src[lo:lo + self.block_edges], self.dst[lo:lo + self.block_edges]
        low = torch.minimum(self.labels[src], self.labels[dst])  # read before writing: a Jacobi update per block
        self.labels.scatter_reduce_(0, src, low, reduce="amin")
        self.labels.scatter_reduce_(0, dst, low, reduce="amin")
        self.block += 1
        if self.block == self.block_count:
            self.labels = self.labels[self.labels]
            self.changed = int((self.labels != self._before).sum())
            self.sweeps += 1
            self.converged = self.changed == 0
            self.components = int(torch.unique(self.labels).numel())  # counted in the bubble, not in progress()
            if not self.converged:
                self._begin_sweep()

    def step(self) -> None:
        self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
        while True:
            self._propagate_block()
            if self.converged or not self.budget.another():
                return

    def is_done(self) -> bool:
        return self.converged

    def component_labels(self) -> np.ndarray:
        """Per vertex, the smallest vertex id of its component (final once is_done())."""
        return self.labels.cpu().numpy()

    def progress(self) -> Mapping[str, float]:
        return {
            "sweeps": float(self.sweeps),
            "changed": float(self.changed),
            "components": float(self.components),
            "edges": float(self.m),
        }

    def state_dict(self) -> Mapping[str, Any]:
        return {
            "labels": self.labels.cpu().clone(),
            "before": self._before.cpu().clone(),
            "block": self.block,
            "sweeps": self.sweeps,
            "changed": self.changed,
            "converged": self.converged,
            "components": self.components,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.labels = state["labels"].to(self.device)
        self._before = state["before"].to(self.device)
        self.block = int(state["block"])
        self.sweeps = int(state["sweeps"])
        self.changed = int(state["changed"])
        self.converged = bool(state["converged"])
        self.components = int(state["components"])

"""PageRank by power iteration on an R-MAT graph, one block of rows at a time.

x' = alpha * (M x + (sum of x over dangling vertices) / n) + (1 - alpha) / n, where
M[j, i] = 1 / outdeg(i) for every edge i -> j: the same iteration (and dangling-vertex rule) as
`networkx.pagerank` with uniform personalization. The sparse product is cut into blocks of whole
rows (`block_edges` entries each, `torch.sparse` CSR); a step computes as many blocks as fit the
bubble, so a graph of any size runs in short bubbles. The blocks are fixed, so how they are
grouped into steps, and pauses and resumes, never change the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from freeride import IterativeTask, StepBudget
from sidetasks.components import ConnectedComponents
from sidetasks.graphs import csr_row_blocks, rmat_edges

__all__ = ["ConnectedComponents", "PageRank"]  # the graph tasks, also as sidetasks.pagerank:ConnectedComponents


class PageRank(IterativeTask):
    """Runs until the L1 change of one iteration is below `tol` (or `max_iter`); progress: residual, iterations."""

    # Measured peak resident set with the defaults (2^16 vertices, 955k edges): ~300 MiB; scale 18 ~470 MiB,
    # scale 20 (16M edges) ~1.2 GiB: pass `freeride submit --mem` for graphs above scale 18.
    # On a GPU the cap counts the CUDA context too (~600 MiB on an H200, CUDA 13.0): 1 GiB leaves room.
    mem_limit_bytes = 1024 * 2**20

    def __init__(self, scale: int = 16, edge_factor: int = 16, alpha: float = 0.85, tol: float = 1e-10,
                 max_iter: int = 1000, block_edges: int = 1 << 18, seed: int = 0, device: str = "cpu",
                 max_step_ms: float = 10.0) -> None:
        if not 0 < alpha < 1 or tol <= 0 or max_iter < 1 or block_edges < 1 or max_step_ms <= 0:
            raise ValueError("need 0 < alpha < 1 and positive tol, max_iter, block_edges, max_step_ms")
        self.scale, self.edge_factor, self.alpha, self.tol = scale, edge_factor, alpha, tol
        self.max_iter, self.block_edges, self.seed, self.device_arg = max_iter, block_edges, seed, device
        self.budget = StepBudget(max_step_ms / 1e3)

    def setup(self) -> None:
        self.device = torch.device(self.context.device if self.device_arg == "auto" else self.device_arg)
        self.budget.track(self.device)  # on a GPU: one unit's kernels in flight at most
        src, dst = rmat_edges(self.scale, self.edge_factor, self.seed)
        self.n = 1 << self.scale
        self.m = len(src)
        outdeg = np.bincount(src, minlength=self.n)
        self.blocks = csr_row_blocks(dst, src, 1.0 / outdeg[src], self.n, self.block_edges, self.device)
        self.dangling = torch.from_numpy(outdeg == 0).to(self.device)
        self.x = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64, device=self.device)
        self.iterations = 0
        self.residual = float("inf")
        self._begin_iteration()
        _ = self.blocks[0][2] @ self.x  # warm-up: the first sparse product is several times slower than the rest

    def _begin_iteration(self) -> None:
        self.block = 0
        self.next = torch.empty_like(self.x)
        leak = float(self.x[self.dangling].sum()) / self.n
        self._base = self.alpha * leak + (1 - self.alpha) / self.n

    def _compute_block(self) -> None:
        start, end, block = self.blocks[self.block]
        self.next[start:end] = self.alpha * (block @ self.x) + self._base
        self.block += 1
        if self.block == len(self.blocks):
            self.residual = float((self.next - self.x).abs().sum())
            self.x = self.next
            self.iterations += 1
            if not self.is_done():
                self._begin_iteration()

    def step(self) -> None:
        self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
        while True:
            self._compute_block()
            if self.is_done() or not self.budget.another():
                return

    def is_done(self) -> bool:
        return self.residual < self.tol or self.iterations >= self.max_iter

    def ranks(self) -> np.ndarray:
        """The current PageRank vector (sums to 1), indexed by vertex id."""
        return self.x.cpu().numpy()

    def progress(self) -> Mapping[str, float]:
        return {
            "iterations": float(self.iterations),
            "residual": min(self.residual, 2.0),  # an L1 distance of two distributions is at most 2
            "blocks_done": float(self.block),
            "edges": float(self.m),
            "converged": float(self.residual < self.tol),
        }

    def state_dict(self) -> Mapping[str, Any]:
        return {
            "x": self.x.cpu().clone(),
            "next": self.next.cpu().clone(),
            "block": self.block,
            "base": self._base,
            "iterations": self.iterations,
            "residual": self.residual,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.x = state["x"].to(self.device)
        self.next = state["next"].to(self.device)
        self.block = int(state["block"])
        self._base = float(state["base"])
        self.iterations = int(state["iterations"])
        self.residual = float(state["residual"])

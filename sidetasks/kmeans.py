"""Mini-batch k-means (Sculley 2010) on generated Gaussian blobs: a small, real, resumable task.

Each step assigns one mini-batch to its nearest centroids and moves them with a per-centroid
learning rate; progress is the inertia on a fixed held-out sample, which falls as it converges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from freeride import IterativeTask


class KMeans(IterativeTask):
    mem_limit_bytes = 256 * 2**20

    def __init__(self, k: int = 8, dim: int = 16, points: int = 200_000, batch: int = 1024,
                 steps: int = 2000, seed: int = 0) -> None:
        self.k, self.dim, self.points, self.batch, self.steps, self.seed = k, dim, points, batch, steps, seed

    def setup(self) -> None:
        rng = np.random.default_rng(self.seed)
        centers = rng.normal(0.0, 10.0, size=(self.k, self.dim))
        labels = rng.integers(0, self.k, size=self.points)
        self.data = (centers[labels] + rng.normal(0.0, 1.0, size=(self.points, self.dim))).astype(np.float32)
        self.holdout = self.data[rng.choice(self.points, size=min(4096, self.points), replace=False)]
        self.centroids = self.data[rng.choice(self.points, size=self.k, replace=False)].copy()
        self.counts = np.zeros(self.k, dtype=np.int64)
        self.rng = np.random.default_rng(self.seed + 1)
        self.done_steps = 0

    def step(self) -> None:
        batch = self.data[self.rng.integers(0, self.points, size=self.batch)]
        nearest = self._assign(batch)
        for j in np.unique(nearest):
            members = batch[nearest == j]
            self.counts[j] += len(members)
            rate = len(members) / self.counts[j]
            self.centroids[j] += rate * (members.mean(axis=0) - self.centroids[j])
        self.done_steps += 1

    def is_done(self) -> bool:
        return self.done_steps >= self.steps

    def inertia(self) -> float:
        nearest = self._assign(self.holdout)
        return float(((self.holdout - self.centroids[nearest]) ** 2).sum(axis=1).mean())

    def progress(self) -> Mapping[str, float]:
        return {"steps": float(self.done_steps), "inertia": self.inertia()}

    def state_dict(self) -> Mapping[str, Any]:
        return {
            "centroids": self.centroids.copy(),
            "counts": self.counts.copy(),
            "rng": self.rng.bit_generator.state,
            "done_steps": self.done_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.centroids = state["centroids"].copy()
        self.counts = state["counts"].copy()
        self.rng.bit_generator.state = state["rng"]
        self.done_steps = int(state["done_steps"])

    def _assign(self, x: np.ndarray) -> np.ndarray:
        d = (x * x).sum(axis=1)[:, None] - 2.0 * x @ self.centroids.T + (self.centroids**2).sum(axis=1)[None, :]
        return np.asarray(d.argmin(axis=1))

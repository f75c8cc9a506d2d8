"""A small ResNet trained on scikit-learn's bundled handwritten digits, one optimizer update at a time.

The 1,797 8x8 digits ship inside the scikit-learn wheel (`load_digits` reads them from disk, no
download). A fixed, seeded, stratified split holds out 20% for accuracy. Each step runs as many
optimizer updates as fit the bubble (at least one); the order of updates depends only on the seed
(each epoch's shuffle is seeded by (seed, epoch)), so how updates are grouped into steps, and
where the task is paused and resumed, never changes the result: a resumed run ends with exactly
the parameters of an uninterrupted one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from freeride import IterativeTask, StepBudget

_CLASSES = 10


class _Block(nn.Module):
    """Basic residual block (He et al. 2016): two 3x3 convs, a projection shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, three stages (8x8 -> 4x4 -> 2x2, width w, 2w, 4w), global average pool, linear head."""

    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers: list[nn.Module] = []
        cin = width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks):
                layers.append(_Block(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(cin, _CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def load_split(seed: int, holdout: float = 0.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bundled digits as (N,1,8,8) float tensors in [0,1], split per class with a seeded shuffle."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(digits.target.astype(np.int64))
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), dtype=bool)
    for c in range(_CLASSES):
        idx = np.flatnonzero(digits.target == c)
        test[rng.choice(idx, size=round(holdout * len(idx)), replace=False)] = True
    return x[~test], y[~test], x[test], y[test]


class DigitsResNet(IterativeTask):
    """Trains a ResNet on the digits for `epochs`; progress: loss, held-out accuracy, epochs, updates."""

    # Measured peak resident set of a worker with the defaults on CPU: ~420 MiB (mostly torch itself). On a GPU
    # the cap counts the CUDA context too: 826 MiB in use before the first step (H200, torch 2.11, CUDA 13.0).
    mem_limit_bytes = 1536 * 2**20

    def __init__(self, epochs: int = 60, batch: int = 32, width: int = 16, blocks: int = 1, lr: float = 0.05,
                 seed: int = 0, device: str = "cpu", max_step_ms: float = 10.0, eval_every: int = 10) -> None:
        if epochs < 1 or batch < 1 or width < 1 or blocks < 1 or lr <= 0 or max_step_ms <= 0 or eval_every < 1:
            raise ValueError("epochs, batch, width, blocks, lr, max_step_ms and eval_every must be positive")
        self.eval_every = eval_every
        self.epochs, self.batch, self.width, self.blocks = epochs, batch, width, blocks
        self.lr, self.seed, self.device_arg = lr, seed, device
        self.budget = StepBudget(max_step_ms / 1e3)

    # -- lifecycle -------------------------------------------------------------------------------
    def setup(self) -> None:
        self.device = torch.device(self._resolve_device())
        self.budget.track(self.device)  # on a GPU: one unit's kernels in flight at most
        x, y, xt, yt = load_split(self.seed)
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.x_test, self.y_test = xt.to(self.device), yt.to(self.device)
        self.per_epoch = len(self.y) // self.batch  # full batches only: every update sees `batch` samples
        if self.per_epoch == 0:
            raise ValueError(f"batch={self.batch} is larger than the {len(self.y)} training digits")
        self.total_updates = self.epochs * self.per_epoch
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the process's global RNG
            torch.manual_seed(self.seed)
            self.model = ResNet(self.width, self.blocks).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
        self.updates = 0
        self.loss_ema = math.log(_CLASSES)
        self._order: tuple[int, torch.Tensor] | None = None
        self._warm_up()
        self.acc = self.accuracy()

    def _warm_up(self) -> None:
        """One forward and backward on a throwaway copy: the first real step is then not 5x slower.

        freeride learns a task's step time from the steps it ran; a first step longer than every
        bubble would keep the task from ever being started again.
        """
        spare = copy.deepcopy(self.model).train()
        F.cross_entropy(spare(self.x[:self.batch]), self.y[:self.batch]).backward()

    def _resolve_device(self) -> str:
        if self.device_arg == "auto":
            return self.context.device
        if self.device_arg.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device={self.device_arg!r} but torch sees no CUDA device (use device=cpu)")
        return self.device_arg

    def step(self) -> None:
        self.budget.start(self.context.remaining_s(), window=self.context.remaining_s)
        while True:
            self._update()
            # Evaluate inside the bubble (not when progress is read), every few updates so that progress
            # shows accuracy early; eval mode changes no parameter, so resume stays exact.
            if self.updates % self.eval_every == 0 or self.updates % self.per_epoch == 0:
                self.acc = self.accuracy()
            if self.is_done() or not self.budget.another():
                return

    def is_done(self) -> bool:
        return self.updates >= self.total_updates

    # -- training --------------------------------------------------------------------------------
    def _batch_indices(self) -> torch.Tensor:
        epoch, k = divmod(self.updates, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.y), generator=g).to(self.device))
        return self._order[1][k * self.batch:(k + 1) * self.batch]

    def _update(self) -> None:
        idx = self._batch_indices()
        for group in self.opt.param_groups:  # cosine decay over the whole run, a function of the update count
            group["lr"] = 0.5 * self.lr * (1 + math.cos(math.pi * self.updates / self.total_updates))
        self.model.train()
        loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        self.loss_ema = 0.95 * self.loss_ema + 0.05 * float(loss.detach())

    @torch.no_grad()
    def accuracy(self) -> float:
        """Fraction of the held-out digits classified right (eval mode: no batch-norm update)."""
        self.model.eval()
        pred = self.model(self.x_test).argmax(dim=1)
        return float((pred == self.y_test).float().mean())

    def progress(self) -> Mapping[str, float]:
        return {
            "loss": self.loss_ema,
            "accuracy": self.acc,  # held-out accuracy, at most `eval_every` updates old
            "epochs": self.updates / self.per_epoch,
            "updates": float(self.updates),
            "done": self.updates / self.total_updates,
        }

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> Mapping[str, Any]:
        cpu = torch.device("cpu")
        opt = self.opt.state_dict()
        return {
            "model": {k: v.detach().to(cpu).clone() for k, v in self.model.state_dict().items()},
            "opt": {
                "state": {i: {k: v.to(cpu).clone() if torch.is_tensor(v) else v for k, v in s.items()}
                          for i, s in opt["state"].items()},
                "param_groups": opt["param_groups"],
            },
            "updates": self.updates,
            "loss_ema": self.loss_ema,
            "acc": self.acc,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])  # moves the momentum buffers to the parameters' device
        self.updates = int(state["updates"])
        self.loss_ema = float(state["loss_ema"])
        self.acc = float(state["acc"])
        self._order = None

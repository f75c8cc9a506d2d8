"""Harvested time in the units people budget in: GPU-hours, and what they are worth net of the training slowdown.

    value      = harvested GPU-hours * price per GPU-hour
    lost       = training GPU-hours * s / (1 + s)     (s: the training slowdown, step time with / without - 1)
    net value  = (harvested - lost) * price

Training GPU-hours are the time the agents had a trainer stream open (`training_s`): training that took T
with side tasks beside it would have taken T / (1 + s) without, so T * s / (1 + s) is what they cost it. The
agent does not measure s; the operator declares it (`freeride bench overhead` and `freeride gpu-check`
measure it). Without one the net value is unknown, and said to be: a slowdown is never assumed to be zero.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any

from freeride.cli.common import UsageError

PRICE_ENV = "FREERIDE_GPU_HOUR_PRICE"
SLOWDOWN_ENV = "FREERIDE_TRAINING_SLOWDOWN"
# No GPU-hour is sold for more (cloud list prices are a few to tens per hour): a larger price is a typo or an
# exponent, and would print figures hundreds of digits long.
MAX_GPU_HOUR_PRICE = 1_000_000.0
NOT_MEASURED = ("slowdown not measured: net value unknown (declare it with --training-slowdown or "
                f"{SLOWDOWN_ENV}, e.g. 0.5% as measured by `freeride bench overhead`)")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-hour-price", metavar="PRICE", default=None,
                   help=f"price of one GPU-hour: show what the harvest is worth (env {PRICE_ENV})")
    p.add_argument("--training-slowdown", metavar="RATIO", default=None,
                   help="the training slowdown with side tasks, e.g. 0.005 or 0.5%%: the net value subtracts what it "
                        f"cost (env {SLOWDOWN_ENV}; left out: not measured, no net value)")


@dataclass(frozen=True)
class Pricing:
    """What the operator declared: a price per GPU-hour, a training slowdown (None: not given)."""

    gpu_hour_price: float | None = None
    training_slowdown: float | None = None

    @classmethod
    def from_args(cls, ns: argparse.Namespace, env: dict[str, str] | None = None) -> Pricing:
        """The flags, else their environment twins; a bad value is a UsageError saying what to give."""
        env = dict(os.environ) if env is None else env
        price = _given(getattr(ns, "gpu_hour_price", None), "--gpu-hour-price", PRICE_ENV, env)
        slowdown = _given(getattr(ns, "training_slowdown", None), "--training-slowdown", SLOWDOWN_ENV, env)
        return cls(None if price is None else _price(*price), None if slowdown is None else _slowdown(*slowdown))


def _given(flag: str | None, name: str, env_name: str, env: dict[str, str]) -> tuple[str, str] | None:
    if flag is not None:
        return flag, name
    raw = env.get(env_name, "").strip()
    return (raw, env_name) if raw else None


def _number(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%")) / (100 if text.strip().endswith("%") else 1)
    except ValueError:
        return math.nan
    return value


def _price(text: str, source: str) -> float:
    value = _number(text) if not text.strip().endswith("%") else math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_GPU_HOUR_PRICE:
        raise UsageError(f"{source} {text!r}: give the price of one GPU-hour as a number >= 0 and at most "
                         f"{MAX_GPU_HOUR_PRICE:,.0f}, e.g. 2.50")
    return value


def _slowdown(text: str, source: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise UsageError(f"{source} {text!r}: give the training slowdown as a ratio between 0 and 1 or a "
                         "percentage, e.g. 0.005 or 0.5%")
    return value


@dataclass(frozen=True)
class Worth:
    """One GPU's (or a fleet's) harvest in GPU-hours and, as far as declared, its value."""

    harvested_gpu_hours: float
    training_gpu_hours: float
    pricing: Pricing

    @classmethod
    def of(cls, harvested_s: float, training_s: float, pricing: Pricing) -> Worth:
        return cls(harvested_s / 3600, training_s / 3600, pricing)

    @property
    def slowdown_gpu_hours(self) -> float | None:
        """Training GPU-hours the slowdown cost (None: no slowdown declared)."""
        s = self.pricing.training_slowdown
        return None if s is None else self.training_gpu_hours * s / (1 + s)

    @property
    def value(self) -> float | None:
        price = self.pricing.gpu_hour_price
        return None if price is None else self.harvested_gpu_hours * price

    @property
    def net_value(self) -> float | None:
        price, lost = self.pricing.gpu_hour_price, self.slowdown_gpu_hours
        return None if price is None or lost is None else (self.harvested_gpu_hours - lost) * price

    def as_dict(self) -> dict[str, Any]:
        """For `--json`: every figure, null where it is unknown, and why."""
        return {
            "harvested_gpu_hours": self.harvested_gpu_hours, "training_gpu_hours": self.training_gpu_hours,
            "gpu_hour_price": self.pricing.gpu_hour_price, "training_slowdown": self.pricing.training_slowdown,
            "slowdown_gpu_hours": self.slowdown_gpu_hours, "value": self.value, "net_value": self.net_value,
            "slowdown_measured": self.pricing.training_slowdown is not None,
        }

    def cells(self) -> list[str]:
        """Table cells: harvested, training, value, slowdown, its cost, net value."""
        s = self.pricing.training_slowdown
        return [
            gpu_hours(self.harvested_gpu_hours), gpu_hours(self.training_gpu_hours), _money(self.value),
            "not measured" if s is None else f"{s:.2%}",
            "-" if self.slowdown_gpu_hours is None else gpu_hours(self.slowdown_gpu_hours),
            _money(self.net_value) if self.pricing.gpu_hour_price is not None else "-",
        ]

    def notes(self) -> list[str]:
        """What is missing for the value figures, one line each."""
        out = []
        if self.pricing.gpu_hour_price is None:
            out.append(f"value: give the price of a GPU-hour with --gpu-hour-price or {PRICE_ENV}")
        if self.pricing.training_slowdown is None:
            out.append(NOT_MEASURED)
        return out


WORTH_COLUMNS = ("harvested GPU-h", "training GPU-h", "value", "training slowdown", "slowdown cost GPU-h",
                 "net value")


def gpu_hours(hours: float) -> str:
    return f"{hours:.4g}" if hours < 1000 else f"{hours:,.0f}"


def _money(amount: float | None) -> str:
    return "-" if amount is None else f"{amount:,.2f}" if abs(amount) >= 0.01 or amount == 0 else f"{amount:.2g}"

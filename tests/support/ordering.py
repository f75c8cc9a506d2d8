"""The order the parallel run hands its tests out in: the modules holding a test marked `slow` first in each
worker's share, so that no long test is left to start last while the other workers sit idle.

pytest-xdist's worksteal first splits the collection into one contiguous share per worker (share k: what is left
divided by the workers left), and an idle worker then steals the back half of the longest queue. A long test near
the end of a share started last: from a clean clone the last 3 % of the parallel run's tests took a minute. Here the
slow modules (whole, so that their module fixtures are set up once) go round-robin to the fronts of the shares, each
share then filled to its size from the rest, in collection order.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import pytest

T = TypeVar("T")


def shares(total: int, workers: int) -> list[int]:
    """The sizes of worksteal's first shares (xdist's WorkStealingScheduling.check_schedule)."""
    sizes, left = [], total
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    return sizes


def slow_first(items: Sequence[T], module: Callable[[T], Hashable], slow: Callable[[T], bool],
               workers: int) -> list[T]:
    """`items` reordered: each module holding a slow item, whole, at the front of a share (round-robin), the rest
    after, in their order; the same items, and the order itself when nothing is slow or there is one worker."""
    heavy_modules = list(dict.fromkeys(module(i) for i in items if slow(i)))
    if workers < 2 or not heavy_modules:
        return list(items)
    by_share: list[list[T]] = [[] for _ in range(workers)]
    for k, mod in enumerate(heavy_modules):
        by_share[k % workers] += [i for i in items if module(i) == mod]
    heavy = set(heavy_modules)
    rest = iter([i for i in items if module(i) not in heavy])
    ordered: list[T] = []
    for front, size in zip(by_share, shares(len(items), workers), strict=True):
        ordered += front
        ordered += itertools.islice(rest, max(0, size - len(front)))
    ordered += list(rest)  # (only where the slow modules outgrew their shares)
    return ordered


class SlowFirst:
    """The plugin: after `-m` has deselected, in each xdist worker (all collect the same order)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
        items[:] = slow_first(items, lambda i: i.path, lambda i: i.get_closest_marker("slow") is not None, workers)

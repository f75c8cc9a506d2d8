"""PoolTask's steps in-process against a real redis-server: what a step leaves acknowledged when it is cut short,
and what a restarted worker takes back."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.redis_server import RedisServer

from freeride import PoolItem, PoolTask, TaskContext, Unavailable
from freeride.pool import Pool, parse_pool_url, range_items


class _Window:
    """A window that never closes: every step may plan its full length."""

    def remaining_s(self) -> float:
        return 1.0

    def yield_point(self) -> None:
        pass


class Recorder(PoolTask):
    """Records every process() call; `hook(item_id)` runs first and may raise."""

    def __init__(self, pool: str, hook: Callable[[str], None] = lambda item_id: None) -> None:
        super().__init__(pool)
        self.hook = hook
        self.calls: list[str] = []

    def process(self, item: PoolItem) -> None:
        self.calls.append(item.id)
        self.hook(item.id)


def _start(task: PoolTask, task_id: str = "1") -> PoolTask:
    task.context = TaskContext(task_id=task_id, checkpoint_path="", gpu=0, _runtime=_Window())
    task.setup()
    return task


def test_items_done_before_a_step_raised_unavailable_are_acknowledged(redis_server: RedisServer) -> None:
    url = redis_server.url("cut")
    pool = Pool(parse_pool_url(url))
    pool.create(range_items(10))
    down = {"5"}

    def hook(item_id: str) -> None:
        if item_id in down:
            down.clear()
            raise Unavailable("the GPU went away")

    task = _start(Recorder(url, hook))
    task.step()  # the first lease is one item: its time sizes the next lease (the other nine)
    with pytest.raises(Unavailable):
        task.step()  # 1..4 done, then 5 raises
    assert task.available()  # what the worker calls before it asks for a window again: acknowledges 1..4
    s = pool.status()
    assert (s.done, s.in_flight, s.queued) == (5, 5, 0)  # items 1..4 are not left pending for another worker
    while not task.is_done():
        task.step()
    task.teardown()
    assert pool.status().done == 10
    assert sorted(task.calls, key=int) == ["0", "1", "2", "3", "4", "5", "5", "6", "7", "8", "9"]  # 5 twice: it raised


def test_a_failure_redis_did_not_hear_of_is_tried_again_and_done_items_are_kept(redis_server: RedisServer) -> None:
    url = redis_server.url("gone")
    pool = Pool(parse_pool_url(url))
    pool.create(range_items(6), max_tries=2)

    def hook(item_id: str) -> None:
        if item_id == "3":
            if len(task.calls) < 5:  # the first time: Redis goes away as the item fails
                redis_server.stop()
            raise ValueError("bad item")

    task = _start(Recorder(url, hook))
    task.step()
    with pytest.raises(Unavailable, match=r"Redis at .* does not answer"):
        task.step()  # 1, 2 done; 3 raises and its failure cannot be recorded
    assert not task.available()
    redis_server.start()
    assert task.available()  # acknowledges 1 and 2
    while not task.is_done():
        task.step()
    task.teardown()
    s = pool.status()
    assert (s.done, s.failed, s.pending) == (5, 1, 0)
    assert [(d.item.id, d.tries, d.error) for d in s.dead] == [("3", 2, "ValueError: bad item")]
    assert task.items_failed == 2 and task.items_done == 5


def test_a_restarted_worker_takes_back_every_item_it_held(redis_server: RedisServer) -> None:
    pool = Pool(parse_pool_url(redis_server.url("own")))
    pool.create(range_items(10))
    held = pool.lease("host/gpu0/task1", 6)
    again = pool.lease("host/gpu0/task1", 1, own=True)  # the new worker's first lease asks for one item
    assert [x.entry for x in again] == [x.entry for x in held]
    assert pool.status(dead_shown=0).in_flight == 6  # dead_shown=0: no dead letters read (XRANGE COUNT 0 is an error)

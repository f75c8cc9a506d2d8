"""The pool's queue operations against a real redis-server: each rule of freeride.pool.queue in-process."""

from __future__ import annotations

import time

import pytest
from support.redis_server import RedisServer

from freeride.errors import PoolError
from freeride.pool import Pool, PoolItem, parse_pool_url, range_items


def _pool(server: RedisServer, name: str = "p", **create: float) -> Pool:
    pool = Pool(parse_pool_url(server.url(name)))
    pool.create(range_items(10), **create)  # type: ignore[arg-type]
    return pool


def test_create_is_idempotent_and_counts(redis_server: RedisServer) -> None:
    pool = _pool(redis_server)
    assert pool.create(range_items(10)) == 0
    assert pool.create(range_items(12)) == 2
    s = pool.status()
    assert (s.total, s.done, s.failed, s.in_flight, s.queued) == (12, 0, 0, 0, 12)


def test_leases_are_disjoint_and_ack_counts_once(redis_server: RedisServer) -> None:
    pool = _pool(redis_server)
    a = pool.lease("a", 4)
    b = pool.lease("b", 4)
    assert {x.item.id for x in a}.isdisjoint({x.item.id for x in b})
    assert pool.ack("a", a, busy_s=0.5) == 4
    assert pool.ack("a", a) == 0  # acknowledged twice: counted once
    s = pool.status()
    assert (s.done, s.in_flight, s.queued) == (4, 4, 2)
    by_name = {c.name: c for c in s.consumers}
    assert by_name["a"].done == 4 and by_name["a"].busy_s == pytest.approx(0.5)


def test_expired_lease_is_reclaimed_and_counted_once(redis_server: RedisServer) -> None:
    pool = _pool(redis_server, lease_s=0.05)
    held = pool.lease("dead", 3)
    time.sleep(0.1)  # the time under test: the lease (50 ms, by Redis's clock) runs out
    again = pool.lease("alive", 10)
    assert {x.item.id for x in held} <= {x.item.id for x in again}
    assert pool.ack("alive", again) == 10
    assert pool.ack("dead", held) == 0  # the dead consumer came back late: nothing counted twice
    assert pool.status().done == 10 and pool.finished()


def test_failing_item_goes_to_dead_letters_after_max_tries(redis_server: RedisServer) -> None:
    pool = _pool(redis_server, max_tries=2)
    first = next(x for x in pool.lease("c", 10) if x.item.id == "3")
    assert pool.fail("c", first, "ValueError: bad pixel") is False
    second = next(x for x in pool.lease("c", 10) if x.item.id == "3")
    assert second.tries == 1
    assert pool.fail("c", second, "ValueError: bad pixel") is True
    s = pool.status()
    assert s.failed == 1 and [d.item.id for d in s.dead] == ["3"] and s.dead[0].error == "ValueError: bad pixel"
    assert pool.retry_failed() == 1
    s = pool.status()
    assert s.failed == 0 and s.dead == []


def test_release_gives_items_back_now(redis_server: RedisServer) -> None:
    pool = _pool(redis_server)
    held = pool.lease("a", 10)
    assert pool.release(held[5:]) == 5
    assert {x.item.id for x in pool.lease("b", 10)} == {x.item.id for x in held[5:]}


def test_own_pending_items_come_back_after_a_restart(redis_server: RedisServer) -> None:
    pool = _pool(redis_server)
    held = pool.lease("host/gpu0/task1", 3)
    again = pool.lease("host/gpu0/task1", 3, own=True)
    assert [x.entry for x in again] == [x.entry for x in held]


def test_args_round_trip_and_missing_pool_is_an_error(redis_server: RedisServer) -> None:
    pool = Pool(parse_pool_url(redis_server.url("args")))
    pool.create([PoolItem("x", {"path": "a.jpg", "n": 3})])
    assert pool.lease("a", 1)[0].item == PoolItem("x", {"path": "a.jpg", "n": 3})
    missing = Pool(parse_pool_url(redis_server.url("nope")))
    with pytest.raises(PoolError, match="does not exist: create it with `freeride pool create"):
        missing.status()
    pool.delete()
    assert not pool.exists()


def test_no_message_about_a_url_shows_its_password() -> None:
    from freeride.pool.url import mask

    for bad in ("redis://:s3cret@h/", "redis://u:s3cret@h:99999/x", "redis://:s3cret@h/0", "http://u:s3cret@h/x"):
        with pytest.raises(PoolError) as err:
            parse_pool_url(bad)
        assert "s3cret" not in str(err.value) and "***" in str(err.value)
    url = parse_pool_url("rediss://u:s3cret@h:6380/2/x?password=s3cret&ssl_cert_reqs=none")
    assert "s3cret" not in str(url) and "s3cret" not in url.safe_redis_url and "s3cret" in url.redis_url
    assert mask("unix://:s3cret@/run/redis.sock/x") == "unix://:***@/run/redis.sock/x"


def test_an_item_whose_workers_keep_dying_becomes_a_dead_letter(redis_server: RedisServer) -> None:
    """A poison item that kills its worker (a segfault, not an exception) must not circulate for ever."""
    pool = Pool(parse_pool_url(redis_server.url("crash")))
    pool.create([PoolItem("killer")], lease_s=0.05, max_tries=3)
    assert [x.item.id for x in pool.lease("w1", 1)] == ["killer"]
    for worker in ("w2", "w3"):
        time.sleep(0.1)  # the time under test: the dead worker's lease (50 ms) runs out
        assert [x.item.id for x in pool.lease(worker, 1)] == ["killer"]  # taken over from the dead one
    time.sleep(0.1)
    assert pool.lease("w4", 1) == []  # three leases died with their workers: it is not handed out again
    s = pool.status()
    assert (s.failed, s.pending) == (1, 0) and pool.finished()
    assert s.dead[0].item.id == "killer" and "died or stalled while holding it" in s.dead[0].error


def test_a_death_inside_process_counts_one_try_for_that_item_alone_and_only_once(redis_server: RedisServer) -> None:
    pool = _pool(redis_server, "died", max_tries=2)
    held = pool.lease("w1", 3)
    poison = held[1]
    assert pool.died("w1", poison.entry, "its worker died while processing it") == (poison.item.id, 1, False)
    assert pool.died("w1", poison.entry, "asked twice") is None  # the restarted worker died before clearing it
    assert pool.died("w2", held[0].entry, "not w2's") is None  # another consumer's item is left alone
    again = pool.lease("w1", 1, own=True)
    assert [x.entry for x in again] == [held[0].entry, held[2].entry]  # the others: still held, no try counted
    assert [(x.item.id, x.tries) for x in again] == [(held[0].item.id, 0), (held[2].item.id, 0)]
    pool.ack("w1", again)
    rest = pool.lease("w1", 10)
    [back] = [x for x in rest if x.item.id == poison.item.id]  # queued again, at the end, with its try
    assert back.tries == 1 and rest[-1] == back
    assert pool.died("w1", back.entry, "its worker died while processing it") == (poison.item.id, 2, True)
    pool.ack("w1", [x for x in rest if x is not back])
    s = pool.status()
    assert (s.done, s.failed, s.pending) == (9, 1, 0) and pool.finished()
    [dead] = s.dead
    assert (dead.item.id, dead.tries, dead.error) == (poison.item.id, 2, "its worker died while processing it")

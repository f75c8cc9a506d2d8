"""PoolTask: a side task whose work is the items of a pool on Redis that many agents share.

User code is `process(item)`; everything else is the public task API. A lease takes about 0.1 s of
work (sized from the measured time per item); a step processes as many of the leased items as fit
its window, and the batch is acknowledged in one round trip once used up (or every 0.5 s), always
after `process` returned, i.e. once the outputs are durable. Items a dead worker or agent
held come back to the others after the pool's lease time; an item whose processing raises
`max_tries` times goes to the pool's dead letters with its error. A worker that dies inside `process`
(a segfault, a kill) cannot say so: before each item it writes the item's stream entry into a marker file
beside its checkpoint (`task-N.ckpt.item`, a pwrite into the page cache: a process's death does not undo
it), and clears it when `process` returns; the restarted worker finds the entry there and counts one try
for that item alone (Pool.died), so a poison item ends in the dead letters instead of killing every
worker that takes it. Redis unreachable: the task raises Unavailable, gives its window back and waits
(backing off) until Redis answers again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from freeride.errors import PoolError, Unavailable
from freeride.pool import Lease, Pool, PoolItem, parse_pool_url
from freeride.pool.driver import redis_py
from freeride.sdk.task import IterativeTask

log = logging.getLogger(__name__)


def _redis_down() -> tuple[type[Exception], ...]:
    """What redis-py raises while Redis does not answer (imported by then: the pool is in use)."""
    redis = redis_py()
    return (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


_FILL = 0.8  # share of the window's remaining time a step may plan to use
# A lease takes about this much work (by the measured time per item), and the batch is acknowledged in one
# round trip when it is used up, or at the end of a step this long after the last acknowledgement: a round
# trip costs ~0.2 ms (more on a loaded machine), so once per step would cost a few percent of short steps.
_BATCH_S = 0.1
_ACK_EVERY_S = 0.5
_MARK_BYTES = 48  # a stream entry id is at most 41 characters (two 64-bit numbers and a dash)
_CLEAR = b" " * _MARK_BYTES


class PoolTask(IterativeTask):
    """Process the items of the pool at `pool` (redis://HOST[:PORT][/DB]/NAME, rediss://…, unix:///…/NAME).

    Subclasses define `process(item)`, which must be idempotent and make its output durable before
    returning (write to a temporary name, then rename): an item may be processed again after a
    crash, never lost. A subclass with its own arguments takes `pool` too and calls
    `super().__init__(pool)`.
    """

    #: Longest planned step (seconds): shorter steps fit more bubbles.
    max_step_s = 0.02
    #: At most this many items leased at once.
    max_lease = 256
    #: First wait (seconds) after Redis stops answering; doubles up to `retry_max_s`.
    retry_s = 1.0
    retry_max_s = 30.0

    def __init__(self, pool: str) -> None:
        redis_py()  # imported here, outside any step (~0.1 s: inside the first one it would count as step time)
        self.pool_url = parse_pool_url(pool)
        self.items_done = 0
        self.items_failed = 0
        self.busy_s = 0.0  # in process()
        self.io_s = 0.0  # in lease and acknowledge round trips
        self._pool: Pool | None = None
        self._leases: deque[Lease] = deque()
        self._unacked: list[Lease] = []
        self._unacked_busy_s = 0.0
        self._unacked_io_s = 0.0
        self._item_s = 0.0  # slowest recent item, decaying: the cost planned for the next one
        self._recent_item_s: deque[float] = deque(maxlen=64)  # for min_step_s: one slow item must not decide
        self._own = True  # the first lease re-reads what this consumer held before a restart
        self._mark_fd: int | None = None  # the marker of the item in process(): see the module's docstring
        # Queue I/O per item of each recent acknowledgement (microseconds): the lease, fail and acknowledge round
        # trips since the one before, over the items it acknowledged.
        self._overhead_us: deque[float] = deque(maxlen=1024)
        self._finished = False
        self._acked_at = time.monotonic()
        self._io_sampled = 0.0

    # -- for subclasses ----------------------------------------------------------------------------
    def process(self, item: PoolItem) -> None:
        """Do one item's work and make its output durable; raise to fail it (it is tried again)."""
        raise NotImplementedError

    # -- checks at submit ----------------------------------------------------------------------------
    @classmethod
    def check_args(cls, **kwargs: Any) -> None:
        """Refuse a submission whose pool URL is malformed, whose Redis does not answer or whose pool is missing."""
        raw = kwargs.get("pool")
        if not isinstance(raw, str) or not raw:
            raise ValueError("pass pool=redis://HOST[:PORT][/DB]/NAME (the pool to draw items from)")
        try:
            url = parse_pool_url(raw)
            with Pool(url, timeout_s=5.0) as pool:
                pool.require()
        except PoolError as exc:
            raise ValueError(str(exc)) from None
        except redis_py().RedisError as exc:
            raise ValueError(f"Redis at {parse_pool_url(raw)} does not answer ({type(exc).__name__}: {exc}); "
                             "check the URL and that Redis runs") from None

    # -- the task API --------------------------------------------------------------------------------
    @property
    def consumer(self) -> str:
        """This task's name in the pool: host, GPU and task id (unique per agent and task)."""
        return f"{socket.gethostname()}/gpu{self.context.gpu}/task{self.context.task_id}"

    def _connect(self) -> Pool:
        if self._pool is None:
            self._pool = Pool(self.pool_url, timeout_s=5.0)
        return self._pool

    def step(self) -> None:
        try:
            self._step()
        except _redis_down() as exc:
            raise Unavailable(f"Redis at {self.pool_url.safe_redis_url} does not answer ({type(exc).__name__}); "
                              "the task resumes when it does", retry_s=self.retry_s,
                              max_retry_s=self.retry_max_s) from None
        except redis_py().ResponseError as exc:
            if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                raise PoolError(f"pool {self.pool_url} was deleted while this task ran") from None
            raise

    def _step(self) -> None:
        pool = self._connect()
        remaining = self.context.remaining_s()
        start = time.perf_counter()
        budget = min(self.max_step_s, _FILL * remaining) if remaining > 0 else 0.0
        if not self._leases:
            self._flush()
            self._lease(pool)
            if not self._leases:
                return
        # An item joins the acknowledgement list as soon as process() returned: a later item of the step that
        # raises Unavailable, or a Redis that stops answering, must not make a done item come back to others
        # after its lease (processed twice, and counted as a lease whose worker died).
        while self._leases:
            lease = self._leases.popleft()
            t0 = time.perf_counter()
            try:
                self._process(lease)
            except Unavailable:
                self._leases.appendleft(lease)
                raise
            except Exception as exc:
                took = time.perf_counter() - t0
                self._unacked_busy_s += took
                try:
                    self._failed(pool, lease, exc)
                except _redis_down():
                    self._leases.appendleft(lease)  # not recorded: processed (and failed) again once Redis is back
                    raise
            else:
                took = time.perf_counter() - t0
                self._unacked_busy_s += took
                self._unacked.append(lease)
            self._item_s = max(took, 0.9 * self._item_s)
            self._recent_item_s.append(took)
            if time.perf_counter() + self._item_s > start + budget:
                break
        if not self._leases or time.monotonic() - self._acked_at >= min(_ACK_EVERY_S, pool.settings()[0] / 4):
            self._flush()

    def _process(self, lease: Lease) -> None:
        """process(), with the item's entry in the marker while it runs (what the next worker reads if this
        one dies inside it)."""
        self._mark(lease.entry.encode().ljust(_MARK_BYTES))
        try:
            self.process(lease.item)
        finally:
            self._mark(_CLEAR)

    def _lease(self, pool: Pool) -> None:
        lease_s, _ = pool.settings()
        batch_s = min(_BATCH_S, lease_s / 20)  # a batch is done long before its lease runs out
        count = max(1, min(self.max_lease, int(batch_s / self._item_s) if self._item_s > 0 else 1))
        t0 = time.perf_counter()
        leased = self._take(pool, count)
        self._io(time.perf_counter() - t0)
        if leased:
            return
        if pool.finished():
            self._finished = True
            return
        raise Unavailable(f"no item of pool {self.pool_url} is free: the rest are in flight on other workers "
                          f"(their leases last {lease_s:g}s)", retry_s=min(self.retry_s, lease_s),
                          max_retry_s=max(lease_s, self.retry_s))

    def _take(self, pool: Pool, count: int) -> int:
        """Lease up to `count` items into the local queue (first, everything this consumer held before a
        restart, less the item its worker died processing: that one is counted a try); how many came."""
        if self._own:
            self._died_processing(pool)
        leases = pool.lease(self.consumer, count, own=self._own, host=socket.gethostname(),
                            gpu=str(self.context.gpu), task=self.context.task_id)
        self._own = False
        self._leases.extend(leases)
        return len(leases)

    def _mark(self, entry: bytes) -> None:
        if self._mark_fd is not None:
            os.pwrite(self._mark_fd, entry, 0)

    def _died_processing(self, pool: Pool) -> None:
        """Open the marker; if the worker before this one died inside process(), count that item's try."""
        if self._mark_fd is None and self.context.checkpoint_path:  # not run by an agent: no marker
            self._mark_fd = os.open(self.context.checkpoint_path + ".item", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                    0o600)
        if self._mark_fd is None:
            return
        entry = os.pread(self._mark_fd, _MARK_BYTES, 0).decode(errors="replace").strip()
        if entry:
            died = pool.died(self.consumer, entry, "its worker died while processing it")
            if died is not None:
                item_id, tries, dead = died
                _, max_tries = pool.settings()
                log.warning("item %s: the worker before this one died while processing it (try %d of %d)%s",
                            item_id, tries, max_tries, "; moved to the dead letters" if dead else "; queued again")
                self.items_failed += 1
            self._mark(_CLEAR)

    def _failed(self, pool: Pool, lease: Lease, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500] if str(exc) else type(exc).__name__
        t0 = time.perf_counter()
        dead = pool.fail(self.consumer, lease, error)
        self._io(time.perf_counter() - t0)
        self.items_failed += 1
        log.warning("item %s failed (%s)%s", lease.item.id, error, "; moved to the dead letters" if dead else "")

    def _io(self, seconds: float) -> None:
        self.io_s += seconds
        self._unacked_io_s += seconds

    def _flush(self) -> None:
        """Acknowledge the items processed since the last acknowledgement (one round trip)."""
        if not self._unacked and self._unacked_busy_s == 0.0:
            return
        pool = self._connect()
        t0 = time.perf_counter()
        io_s = self._unacked_io_s + 0.0
        newly = pool.ack(self.consumer, self._unacked, busy_s=self._unacked_busy_s, io_s=io_s)
        took = time.perf_counter() - t0
        self.io_s += took
        self._acked_at = time.monotonic()
        if self._unacked:
            self._overhead_us.append((self.io_s - self._io_sampled) * 1e6 / len(self._unacked))
            self._io_sampled = self.io_s
        self.busy_s += self._unacked_busy_s
        self.items_done += newly
        self._unacked, self._unacked_busy_s, self._unacked_io_s = [], 0.0, took

    def is_done(self) -> bool:
        return self._finished

    def min_step_s(self) -> float | None:
        """A step shrinks to one item: the median of the recent items, with half again for the odd slow one.

        Not the slowest item, nor a round trip to Redis: a value only a step can refresh must not be one
        outlier, or the task would never be judged to fit a window again.
        """
        if len(self._recent_item_s) < 5:  # the first items pay for warm-up: measured steps decide till then
            return None
        return 1.5 * sorted(self._recent_item_s)[len(self._recent_item_s) // 2]

    def available(self) -> bool:
        """Redis answers and the pool has a free item again (leased here at once), or it is finished."""
        pool = self._connect()
        try:
            pool.ping()
        except _redis_down():
            return False  # still down: what the wait is for, not an error to log with its traceback
        self._flush()
        if self._leases:
            return True
        self._take(pool, 1)
        if not self._leases and pool.finished():
            self._finished = True
        return bool(self._leases) or self._finished

    def teardown(self) -> None:
        """Give back the items leased and not started; acknowledge those done; close the connection."""
        if self._pool is None:
            return
        try:
            self._flush()
            self._pool.release(self._leases)
            self._leases.clear()
        except redis_py().RedisError as exc:  # Redis down: the leases come back to others after the lease time
            log.warning("could not give back %d leased items (%s); others take them after the lease time",
                        len(self._leases), exc)
        finally:
            self._pool.close()
            self._pool = None
            if self._mark_fd is not None:
                os.close(self._mark_fd)
                self._mark_fd = None

    def progress(self) -> Mapping[str, float]:
        spent = self.busy_s + self.io_s
        overhead = sorted(self._overhead_us)
        return {
            "items": float(self.items_done),
            "failed": float(self.items_failed),
            "items_per_s": self.items_done / self.busy_s if self.busy_s > 0 else 0.0,
            "queue_io_share": self.io_s / spent if spent > 0 else 0.0,
            "queue_us_per_item_p50": overhead[len(overhead) // 2] if overhead else 0.0,
            "queue_us_per_item_p99": overhead[int(0.99 * (len(overhead) - 1))] if overhead else 0.0,
        }

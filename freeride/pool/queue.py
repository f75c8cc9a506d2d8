"""A work pool on Redis Streams: items enqueued once, leased by consumers, acknowledged when durable.

Keys (one hash tag per pool, so a Redis Cluster keeps them on one node):

- `freeride:pool:{NAME}:items`  the stream of items (done ones trimmed away as the pool goes), with the consumer group
  `workers`. An entry's fields: `id` (the item's id), `args` (JSON object), `tries` (failed attempts
  so far), `error` (the last one's message).
- `…:ids`       every item id ever enqueued: makes `create` idempotent.
- `…:meta`      hash: total, done, failed, lease_s, max_tries, created_unix.
- `…:dead`      the dead-letter stream: items that failed `max_tries` times, with their last error. A failure
  is `process()` raising, or its worker dying while processing the item (`died`, told by the restarted
  worker), or a lease that ran out (its worker died or stalled: counted when another consumer takes it).
- `…:consumers` set of consumer names; `…:consumer:NAME` one hash per consumer (host, gpu, task, done,
  failed, busy_s, io_s, first_unix, last_unix).

Every change of more than one key is one Lua script, so a consumer killed between two calls never
leaves counts that disagree with the stream: an item is counted done by the XACK that took it out
of the group's pending list (a second consumer that reclaimed and finished it too counts nothing),
and the same script trims the done entries off the stream's old end, so it holds little more than
the work left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from freeride.errors import PoolError
from freeride.pool.driver import redis_py
from freeride.pool.url import PoolUrl

if TYPE_CHECKING:
    import redis

GROUP = "workers"
DEFAULT_LEASE_S = 30.0
DEFAULT_MAX_TRIES = 3
_BATCH = 1000  # items per script call: Lua's unpack() takes a few thousand at most
_RECENT_S = 60.0  # consumers heard from within this long count towards the pool's rate

# KEYS: items, ids, meta. ARGV: id1, args1, id2, args2, ...  -> number added
_ENQUEUE = """
local added = 0
for i = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'id', ARGV[i], 'args', ARGV[i + 1], 'tries', '0')
    added = added + 1
  end
end
redis.call('HINCRBY', KEYS[3], 'total', added)
return added
"""

# KEYS: items, meta, dead, consumer hash, consumers set.
# ARGV: consumer, count, lease_ms, max_tries, now_unix, own (1: first re-read this consumer's pending), host, gpu, task
# -> JSON: [[entry_id, item_id, args, tries], ...] (one bulk string: far cheaper for the client to read
# than a nested reply)
_LEASE = """
local out = {}
local n = tonumber(ARGV[2])
local function take(entries)
  for _, e in ipairs(entries) do
    local f = e[2]
    if f then
      local rec = {}
      for i = 1, #f, 2 do rec[f[i]] = f[i + 1] end
      table.insert(out, {e[1], rec['id'] or '', rec['args'] or '{}', rec['tries'] or '0'})
    else
      redis.call('XACK', KEYS[1], 'workers', e[1])
    end
  end
end
local function read(from)
  local r
  if from == '0' then  -- this consumer's own pending entries: all of them, whatever the count
    r = redis.call('XREADGROUP', 'GROUP', 'workers', ARGV[1], 'STREAMS', KEYS[1], from)
  else
    r = redis.call('XREADGROUP', 'GROUP', 'workers', ARGV[1], 'COUNT', n - #out, 'STREAMS', KEYS[1], from)
  end
  if r and r[1] then take(r[1][2]) end
end
if redis.call('SADD', KEYS[5], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[4], 'first_unix') == 0 then
  redis.call('HSET', KEYS[4], 'host', ARGV[7], 'gpu', ARGV[8], 'task', ARGV[9], 'first_unix', ARGV[5])
end
redis.call('HSET', KEYS[4], 'last_unix', ARGV[5])
if ARGV[6] == '1' then read('0') end
if #out < n then
  local stale = redis.call('XPENDING', KEYS[1], 'workers', 'IDLE', ARGV[3], '-', '+', n - #out)
  local max_tries = tonumber(ARGV[4])
  for _, p in ipairs(stale) do
    local claimed = redis.call('XCLAIM', KEYS[1], 'workers', ARGV[1], ARGV[3], p[1])
    local e = claimed[1]
    if e and e[2] then
      local rec = {}
      for i = 1, #e[2], 2 do rec[e[2][i]] = e[2][i + 1] end
      local attempts = tonumber(rec['tries'] or '0') + tonumber(p[4])
      if attempts >= max_tries then
        redis.call('XADD', KEYS[3], '*', 'id', rec['id'] or '', 'args', rec['args'] or '{}', 'tries', attempts,
          'error', 'its worker died or stalled while holding it (' .. p[4] .. ' leases by ' .. p[2] .. ')',
          'consumer', p[2], 'unix', ARGV[5])
        redis.call('XACK', KEYS[1], 'workers', p[1]); redis.call('XDEL', KEYS[1], p[1])
        redis.call('HINCRBY', KEYS[2], 'failed', 1)
      else
        take({e})
      end
    elseif e then
      redis.call('XACK', KEYS[1], 'workers', p[1])
    end
  end
end
if #out < n then read('>') end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""

# KEYS: items, meta, consumer hash. ARGV: now_unix, busy_s, io_s, entry ids... -> items newly done.
# Done entries leave the stream by trimming (XTRIM MINID, whole nodes at a time): every entry older than
# the oldest one still pending, or than the last delivered when none is, is done. XDEL per entry costs
# ~5 us each; the trim, next to nothing.
_ACK = """
local done = 0
if #ARGV > 3 then done = redis.call('XACK', KEYS[1], 'workers', unpack(ARGV, 4)) end
local pending = redis.call('XPENDING', KEYS[1], 'workers')
local minid = pending[2]
if pending[1] == 0 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local fields = {}
    for i = 1, #g, 2 do fields[g[i]] = g[i + 1] end
    if fields['name'] == 'workers' then
      local ms, seq = string.match(fields['last-delivered-id'], '(%d+)-(%d+)')
      minid = ms .. '-' .. (tonumber(seq) + 1)
    end
  end
end
if minid then redis.call('XTRIM', KEYS[1], 'MINID', '~', minid) end
redis.call('HINCRBY', KEYS[2], 'done', done)
redis.call('HINCRBY', KEYS[3], 'done', done)
redis.call('HINCRBYFLOAT', KEYS[3], 'busy_s', ARGV[2])
redis.call('HINCRBYFLOAT', KEYS[3], 'io_s', ARGV[3])
redis.call('HSET', KEYS[3], 'last_unix', ARGV[1])
return done
"""

# KEYS: items, meta, dead, consumer hash. ARGV: entry, item_id, args, tries, error, max_tries, consumer, now
# -> 1 when the item went to the dead letters, 0 when it was queued again, -1 when it was no longer ours
_FAIL = """
if redis.call('XACK', KEYS[1], 'workers', ARGV[1]) == 0 then return -1 end
redis.call('XDEL', KEYS[1], ARGV[1])
local tries = tonumber(ARGV[4]) + 1
redis.call('HINCRBY', KEYS[4], 'failed', 1)
if tries >= tonumber(ARGV[6]) then
  redis.call('XADD', KEYS[3], '*', 'id', ARGV[2], 'args', ARGV[3], 'tries', tries, 'error', ARGV[5],
    'consumer', ARGV[7], 'unix', ARGV[8])
  redis.call('HINCRBY', KEYS[2], 'failed', 1)
  return 1
end
redis.call('XADD', KEYS[1], '*', 'id', ARGV[2], 'args', ARGV[3], 'tries', tries, 'error', ARGV[5])
return 0
"""

# KEYS: items, meta, dead, consumer hash. ARGV: entry, consumer, max_tries, error, now
# -> JSON [item_id, tries, dead (1/0)], or '' when the entry is no longer this consumer's (done, or taken over
# after its lease: that XCLAIM counted the death already). Its worker died while processing it: one try, as
# for an exception, and the item goes back to the queue's end, or to the dead letters after max_tries.
_DIED = """
local held = redis.call('XPENDING', KEYS[1], 'workers', ARGV[1], ARGV[1], 1, ARGV[2])
if not held[1] then return '' end
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])[1]
redis.call('XACK', KEYS[1], 'workers', ARGV[1])
if not e then return '' end
redis.call('XDEL', KEYS[1], ARGV[1])
local rec = {}
for i = 1, #e[2], 2 do rec[e[2][i]] = e[2][i + 1] end
local tries = tonumber(rec['tries'] or '0') + 1
redis.call('HINCRBY', KEYS[4], 'failed', 1)
if tries >= tonumber(ARGV[3]) then
  redis.call('XADD', KEYS[3], '*', 'id', rec['id'] or '', 'args', rec['args'] or '{}', 'tries', tries,
    'error', ARGV[4], 'consumer', ARGV[2], 'unix', ARGV[5])
  redis.call('HINCRBY', KEYS[2], 'failed', 1)
  return cjson.encode({rec['id'] or '', tries, 1})
end
redis.call('XADD', KEYS[1], '*', 'id', rec['id'] or '', 'args', rec['args'] or '{}', 'tries', tries, 'error', ARGV[4])
return cjson.encode({rec['id'] or '', tries, 0})
"""

# KEYS: items. ARGV: entries... (leased, not started): back to the queue now, not after the lease timeout
_RELEASE = """
local n = 0
for i = 1, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])[1]
  if e and redis.call('XACK', KEYS[1], 'workers', ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    redis.call('XADD', KEYS[1], '*', unpack(e[2]))
    n = n + 1
  end
end
return n
"""

# KEYS: items, meta, dead. ARGV: count -> number moved back
_RETRY = """
local moved = 0
for _, e in ipairs(redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', ARGV[1])) do
  local rec = {}
  for i = 1, #e[2], 2 do rec[e[2][i]] = e[2][i + 1] end
  redis.call('XADD', KEYS[1], '*', 'id', rec['id'], 'args', rec['args'], 'tries', '0', 'error', rec['error'] or '')
  redis.call('XDEL', KEYS[3], e[1])
  moved = moved + 1
end
if moved > 0 then redis.call('HINCRBY', KEYS[2], 'failed', -moved) end  -- Lua sends -0 as "-0": not an integer
return moved
"""


@dataclass(frozen=True)
class PoolItem:
    """One piece of work: an id unique in its pool and the arguments to process it with."""

    id: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Lease:
    """An item leased to one consumer; it must be acknowledged, failed or released."""

    entry: str
    item: PoolItem
    tries: int


@dataclass(frozen=True)
class Consumer:
    name: str
    host: str
    gpu: str
    task: str
    done: int
    failed: int
    busy_s: float  # seconds spent in process(): harvested time spent on items
    io_s: float  # seconds spent on queue I/O (lease, acknowledge)
    first_unix: float
    last_unix: float

    @property
    def items_per_s(self) -> float:
        span = self.last_unix - self.first_unix
        return self.done / span if span > 0 else 0.0


@dataclass(frozen=True)
class DeadLetter:
    item: PoolItem
    tries: int
    error: str
    consumer: str


@dataclass(frozen=True)
class PoolStatus:
    url: str
    total: int
    done: int
    failed: int
    in_flight: int  # leased by a consumer, not yet acknowledged
    queued: int  # waiting for a consumer
    lease_s: float
    max_tries: int
    created_unix: float
    consumers: list[Consumer]
    dead: list[DeadLetter]  # the first few dead letters
    now_unix: float

    @property
    def pending(self) -> int:
        """Items not finished yet: queued or in flight."""
        return self.queued + self.in_flight

    @property
    def items_per_s(self) -> float:
        """Items per second of the consumers heard from in the last minute."""
        return sum(c.items_per_s for c in self.consumers if self.now_unix - c.last_unix <= _RECENT_S)

    @property
    def eta_s(self) -> float | None:
        """Seconds until every item is done at the recent rate: 0 when none is pending, None with no rate."""
        if not self.pending:
            return 0.0
        rate = self.items_per_s
        return self.pending / rate if rate > 0 else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Pool:
    """One pool on one Redis; every call is one round trip (or one per batch of 1000 for create)."""

    def __init__(self, url: PoolUrl, timeout_s: float = 5.0, client: redis.Redis | None = None) -> None:
        self.url = url
        self._r = client if client is not None else redis_py().Redis.from_url(
            url.redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        base = f"freeride:pool:{{{url.name}}}"
        self.k_items, self.k_ids, self.k_meta = f"{base}:items", f"{base}:ids", f"{base}:meta"
        self.k_dead, self.k_consumers = f"{base}:dead", f"{base}:consumers"
        self._consumer_prefix = f"{base}:consumer:"
        self._enqueue = self._r.register_script(_ENQUEUE)
        self._lease = self._r.register_script(_LEASE)
        self._ack = self._r.register_script(_ACK)
        self._fail = self._r.register_script(_FAIL)
        self._release = self._r.register_script(_RELEASE)
        self._died = self._r.register_script(_DIED)
        self._retry = self._r.register_script(_RETRY)
        self._settings: tuple[float, int] | None = None

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- administration --------------------------------------------------------------------------
    def exists(self) -> bool:
        return bool(self._r.exists(self.k_meta))

    def require(self) -> None:
        """PoolError unless the pool exists (a one-line message that says how to make it)."""
        if not self.exists():
            raise PoolError(f"pool {self.url} does not exist: create it with `freeride pool create {self.url} "
                            "--items FILE` (or --range N)")

    def create(self, items: Iterable[PoolItem], lease_s: float = DEFAULT_LEASE_S,
               max_tries: int = DEFAULT_MAX_TRIES) -> int:
        """Create the pool if needed and enqueue the items not enqueued before; returns how many were added."""
        if lease_s <= 0 or max_tries < 1:
            raise PoolError(f"need lease_s > 0 and max_tries >= 1, got {lease_s} and {max_tries}")
        try:
            self._r.xgroup_create(self.k_items, GROUP, id="0", mkstream=True)
        except redis_py().ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._r.hsetnx(self.k_meta, "created_unix", f"{time.time():.3f}")
        self._r.hset(self.k_meta, mapping={"lease_s": lease_s, "max_tries": max_tries})
        self._r.hsetnx(self.k_meta, "total", 0)
        self._settings = None
        added = 0
        for batch in _batches(items, _BATCH):
            argv: list[str] = []
            for item in batch:
                argv += [item.id, json.dumps(dict(item.args), sort_keys=True)]
            added += int(self._enqueue(keys=[self.k_items, self.k_ids, self.k_meta], args=argv))
        return added

    def settings(self) -> tuple[float, int]:
        """(lease_s, max_tries) as set at create."""
        if self._settings is None:
            lease_s, max_tries = self._r.hmget(self.k_meta, ["lease_s", "max_tries"])
            if lease_s is None:
                self.require()
            self._settings = (float(lease_s or DEFAULT_LEASE_S), int(max_tries or DEFAULT_MAX_TRIES))
        return self._settings

    def status(self, dead_shown: int = 20) -> PoolStatus:
        self.require()
        meta = {_text(k): _text(v) for k, v in self._r.hgetall(self.k_meta).items()}
        in_flight = 0
        for group in self._r.xinfo_groups(self.k_items):
            if _text(group["name"]) == GROUP:
                in_flight = int(group["pending"])
        names = sorted(_text(n) for n in self._r.smembers(self.k_consumers))
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self._consumer_prefix + name)
        consumers = []
        for name, raw in zip(names, pipe.execute(), strict=True):
            c = {_text(k): _text(v) for k, v in raw.items()}
            consumers.append(Consumer(
                name=name, host=c.get("host", ""), gpu=c.get("gpu", ""), task=c.get("task", ""),
                done=int(c.get("done", 0)), failed=int(c.get("failed", 0)), busy_s=float(c.get("busy_s", 0)),
                io_s=float(c.get("io_s", 0)), first_unix=float(c.get("first_unix", 0)),
                last_unix=float(c.get("last_unix", 0)),
            ))
        dead = []
        raw_dead = self._r.xrange(self.k_dead, count=dead_shown) if dead_shown > 0 else []  # XRANGE COUNT 0: an error
        for _, raw_fields in raw_dead or []:
            f = {_text(k): _text(v) for k, v in (raw_fields or {}).items()}
            dead.append(DeadLetter(item=PoolItem(f.get("id", ""), json.loads(f.get("args", "{}"))),
                                   tries=int(f.get("tries", 0)), error=f.get("error", ""),
                                   consumer=f.get("consumer", "")))
        total, done, failed = (int(meta.get(k, 0)) for k in ("total", "done", "failed"))
        return PoolStatus(
            url=str(self.url), total=total, done=done, failed=failed, in_flight=in_flight,
            queued=max(0, total - done - failed - in_flight),
            lease_s=float(meta.get("lease_s", DEFAULT_LEASE_S)),
            max_tries=int(meta.get("max_tries", DEFAULT_MAX_TRIES)),
            created_unix=float(meta.get("created_unix", 0)), consumers=consumers, dead=dead, now_unix=time.time(),
        )

    def retry_failed(self) -> int:
        """Move every dead letter back to the queue with its tries reset; returns how many."""
        self.require()
        moved = 0
        while True:
            n = int(self._retry(keys=[self.k_items, self.k_meta, self.k_dead], args=[_BATCH]))
            moved += n
            if n < _BATCH:
                return moved

    def delete(self) -> None:
        """Remove the pool and everything Redis holds of it (never the items' outputs)."""
        self.require()
        names = [_text(n) for n in self._r.smembers(self.k_consumers)]
        self._r.delete(self.k_items, self.k_ids, self.k_meta, self.k_dead, self.k_consumers,
                       *(self._consumer_prefix + n for n in names))

    # -- consumers -------------------------------------------------------------------------------
    def lease(self, consumer: str, count: int, own: bool = False, host: str = "", gpu: str = "",
              task: str = "") -> list[Lease]:
        """Items for `consumer`. First, when `own` (after a restart), every item it still holds, however
        many: one left behind would come back only when its lease expired, counted as a lease its worker
        died with. Then, up to `count` in all, items whose lease expired (an item held by consumers that
        died `max_tries` times goes to the dead letters instead), then new ones."""
        lease_s, max_tries = self.settings()
        flat = self._lease(
            keys=[self.k_items, self.k_meta, self.k_dead, self._consumer_prefix + consumer, self.k_consumers],
            args=[consumer, max(1, count), int(lease_s * 1000), max_tries, f"{time.time():.3f}", int(own),
                  host, gpu, task],
        )
        return [Lease(entry=entry, item=PoolItem(item_id, json.loads(args)), tries=int(tries))
                for entry, item_id, args, tries in json.loads(flat)]

    def ack(self, consumer: str, leases: Iterable[Lease], busy_s: float = 0.0, io_s: float = 0.0) -> int:
        """The items' outputs are durable: take them out of the pool. Returns how many were newly done."""
        entries = [lease.entry for lease in leases]
        done = 0
        for start in range(0, max(1, len(entries)), _BATCH):
            done += int(self._ack(keys=[self.k_items, self.k_meta, self._consumer_prefix + consumer],
                                  args=[f"{time.time():.3f}", repr(busy_s if start == 0 else 0.0),
                                        repr(io_s if start == 0 else 0.0), *entries[start:start + _BATCH]]))
        return done

    def fail(self, consumer: str, lease: Lease, error: str) -> bool:
        """Processing the item raised: queue it again, or after max_tries put it in the dead letters (True)."""
        _, max_tries = self.settings()
        return int(self._fail(
            keys=[self.k_items, self.k_meta, self.k_dead, self._consumer_prefix + consumer],
            args=[lease.entry, lease.item.id, json.dumps(dict(lease.item.args), sort_keys=True), lease.tries,
                  error[:1000], max_tries, consumer, f"{time.time():.3f}"],
        )) == 1

    def died(self, consumer: str, entry: str, error: str) -> tuple[str, int, bool] | None:
        """`consumer`'s worker died while processing the item of `entry` (a segfault, a kill): count one try.

        The item goes back to the queue's end, or to the dead letters once it has had `max_tries`; returns
        (item id, tries, dead), or None when the entry is no longer the consumer's (acknowledged, or taken
        over by another after its lease, which counted the death already). Asking twice counts once.
        """
        _, max_tries = self.settings()
        out = self._died(keys=[self.k_items, self.k_meta, self.k_dead, self._consumer_prefix + consumer],
                         args=[entry, consumer, max_tries, error[:1000], f"{time.time():.3f}"])
        if not out:
            return None
        item_id, tries, dead = json.loads(out)
        return str(item_id), int(tries), bool(dead)

    def release(self, leases: Iterable[Lease]) -> int:
        """Give back items leased but not started, so others take them now rather than after the lease."""
        entries = [lease.entry for lease in leases]
        return int(self._release(keys=[self.k_items], args=entries)) if entries else 0

    def finished(self) -> bool:
        """Every item enqueued is done or dead."""
        total, done, failed = self._r.hmget(self.k_meta, ["total", "done", "failed"])
        if total is None:
            self.require()
        return int(done or 0) + int(failed or 0) >= int(total or 0)

    def ping(self) -> bool:
        return bool(self._r.ping())


def _batches(items: Iterable[PoolItem], size: int) -> Iterator[list[PoolItem]]:
    batch: list[PoolItem] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch

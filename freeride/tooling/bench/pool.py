"""`freeride bench pool`: one work pool drained by several agents; what does the queue cost?

K agents on fake GPUs 0..K-1, each with a synthetic trainer rank (one `--bubble-ms` bubble every
`--period-ms`, the ranks' phases spread over the period) and a FilePool task: item i costs
`--work-us` of CPU (`--work sleep`: of sleep, as a GPU kernel's wait) and writes one file. Redis
is a redis-server of the bench's own (unix socket, append-only file with `appendfsync everysec`,
as docs/pools.md advises) unless `--redis URL` names one.

What it reports:

- `seconds`: from the first bubble to the last task DONE; `items_per_s` = items / seconds.
- `queue_io_share`: every consumer's seconds in lease, acknowledge and fail round trips (as the pool
  counts them) over every agent's harvested seconds. The queue's I/O runs inside the steps, so it is
  a part of the harvest that did no item's work.
- `redis_cpu_s`: the Redis server's CPU time over the run (`INFO cpu`), and per item.
- `queue_us_per_item_p50` / `_p99`: per acknowledgement, the queue I/O since the one before (its
  lease included) divided by the items it acknowledged. Each task reports its own p50 and p99 over
  its recent acknowledgements; the bench's p50 is the median of the tasks' p50s weighted by the
  items each did, its p99 the highest task p99 (an upper bound of the p99 over all of them).

The round trips are wall-clock time: where the agents' CPU-bound workers outnumber the cores (the
default's 8 agents on a 2-core machine), each one also waits for a core, for Redis and then for the
worker. `--work sleep`, or as many agents as cores, measures the queue itself.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from freeride.errors import FreerideError
from freeride.tooling.bench import paths
from freeride.v1 import tasks_pb2

# redis, the pool and the harness that drives it are imported when the bench runs: `freeride --help` builds
# every bench's parser, and must not pay for (or need) redis-py.


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, default=8, help="agents (fake GPUs), each with its own trainer rank")
    p.add_argument("--items", type=int, default=20000, help="items in the pool")
    p.add_argument("--work-us", type=float, default=2000.0, help="the work of one item, before it writes its output")
    p.add_argument("--work", choices=["cpu", "sleep"], default="cpu",
                   help="cpu: a busy loop (the agents' workers share the machine's cores); sleep: a GPU kernel's "
                        "wait, which leaves the CPU free")
    p.add_argument("--max-step-ms", type=float, default=0.0,
                   help="FilePool's longest planned step (default 0: PoolTask's own, 20 ms)")
    p.add_argument("--bubble-ms", type=float, default=20.0, help="each rank's bubble")
    p.add_argument("--period-ms", type=float, default=30.0, help="one bubble per this long, per rank")
    p.add_argument("--lease-s", type=float, default=30.0, help="the pool's lease time")
    p.add_argument("--redis", metavar="URL",
                   help="a running Redis (redis://HOST[:PORT][/DB], unix:///PATH/redis.sock); the bench makes a "
                        "pool of its own there and deletes it afterwards. Default: a redis-server of its own")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up when the pool is not drained by then")


def _pool_url(redis_url: str, name: str) -> str:
    from freeride.pool import parse_pool_url

    base, sep, query = redis_url.partition("?")
    url = f"{base.rstrip('/')}/{name}{sep}{query}"
    parse_pool_url(url)  # a malformed --redis fails here, in one line
    return url


def _redis_info(url: str, section: str) -> dict[str, Any]:
    """One section of the Redis server's INFO."""
    from freeride.pool import parse_pool_url
    from freeride.pool.driver import redis_py

    with redis_py().Redis.from_url(parse_pool_url(url).redis_url, socket_timeout=5.0) as r:
        return dict(r.info(section))


def _redis_cpu_s(url: str) -> float:
    """CPU seconds the Redis server has used since it started (every client's work, not only this pool's)."""
    cpu = _redis_info(url, "cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run(ns: argparse.Namespace) -> dict[str, Any]:
    from freeride.tooling.redis_server import RedisServer

    if ns.agents < 1 or ns.items < 1 or ns.work_us < 0:
        raise FreerideError("--agents and --items must be positive, --work-us not negative")
    with tempfile.TemporaryDirectory(prefix="freeride-bench-pool-") as tmp:
        root = Path(tmp)
        if ns.redis:
            return _run(ns, root, _pool_url(ns.redis, f"bench-{uuid.uuid4().hex[:12]}"), "given")
        with RedisServer(root / "redis", appendfsync="everysec") as server:
            return _run(ns, root, server.url("bench"), "own redis-server, appendfsync everysec")


def _run(ns: argparse.Namespace, root: Path, url: str, redis_kind: str) -> dict[str, Any]:
    from freeride.tooling.poolrun import FAKE_GPU, PoolRun

    agent_args = [*FAKE_GPU, *paths.AGENT_ARGS]
    with PoolRun(root, url, ns.agents, work_us=ns.work_us, cpu=ns.work == "cpu", max_step_ms=ns.max_step_ms,
                 bubble_ms=ns.bubble_ms, period_ms=ns.period_ms, agent_args=agent_args) as run:
        try:
            run.create(ns.items, lease_s=ns.lease_s)
            run.start()
            redis_cpu_s = -_redis_cpu_s(url)
            t0 = time.monotonic()
            infos = run.wait_finished(ns.timeout_s)
            seconds = time.monotonic() - t0
            redis_cpu_s += _redis_cpu_s(url)
            status = run.pool.status()
            stats = run.agent_stats()
        finally:
            if ns.redis:
                run.pool.delete()
    failed = {k: f"{tasks_pb2.TaskState.Name(i.state)} {i.reason}" for k, i in infos.items()
              if i.state != tasks_pb2.TASK_STATE_DONE}
    if failed:
        raise FreerideError(f"bench pool: tasks did not finish: {failed}")
    harvested_s = sum(s.gpu.harvested_s for s in stats.values())
    io_s = sum(c.io_s for c in status.consumers)
    busy_s = sum(c.busy_s for c in status.consumers)
    per_task = [(i.progress["items"], i.progress["queue_us_per_item_p50"], i.progress["queue_us_per_item_p99"])
                for i in infos.values()]
    return {
        "benchmark": "pool",
        "agents": ns.agents, "items": ns.items, "work_us": ns.work_us, "work": ns.work, "max_step_ms": ns.max_step_ms,
        "bubble_ms": ns.bubble_ms, "period_ms": ns.period_ms,
        "done": status.done, "failed": status.failed,
        "seconds": round(seconds, 3),
        "items_per_s": round(status.done / seconds, 1) if seconds > 0 else 0.0,
        "queue_us_per_item_p50": round(_weighted_median([(p50, n) for n, p50, _ in per_task]), 1),
        "queue_us_per_item_p99": round(max(p99 for _, _, p99 in per_task), 1),
        "queue_io_s": round(io_s, 4),
        "process_s": round(busy_s, 4),
        "harvested_s": round(harvested_s, 4),
        "bubble_s": round(sum(s.gpu.bubble_s for s in stats.values()), 4),
        "queue_io_share": round(io_s / harvested_s, 5) if harvested_s > 0 else 0.0,
        "redis_cpu_s": round(redis_cpu_s, 4),
        "redis_cpu_us_per_item": round(redis_cpu_s * 1e6 / status.done, 1) if status.done else 0.0,
        "per_agent": [{"gpu": k, "items": int(infos[k].progress["items"]),
                       "harvested_s": round(stats[k].gpu.harvested_s, 4),
                       "queue_us_per_item_p50": round(infos[k].progress["queue_us_per_item_p50"], 1),
                       "queue_us_per_item_p99": round(infos[k].progress["queue_us_per_item_p99"], 1)}
                      for k in sorted(infos)],
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "redis": redis_kind,
        "redis_version": str(_redis_info(url, "server")["redis_version"]),
    }


def _weighted_median(values: list[tuple[float, float]]) -> float:
    """The median of `values` (value, weight): the first value whose cumulative weight reaches half."""
    ordered = sorted(values)
    total = sum(w for _, w in ordered)
    if total <= 0:
        return ordered[len(ordered) // 2][0] if ordered else 0.0
    acc = 0.0
    for value, weight in ordered:
        acc += weight
        if acc >= total / 2:
            return value
    return ordered[-1][0]

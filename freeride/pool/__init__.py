"""Work pools on Redis Streams: one batch job whose items every agent's workers draw from.

Shared by the pool task (freeride.sdk.pool, in workers) and `freeride pool …` (the CLI). redis-py is the
`pool` extra, imported only when a pool is used (freeride.pool.driver): without it, a one-line PoolError.
"""

from freeride.pool.items import parse_lines, range_items
from freeride.pool.queue import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_TRIES,
    Consumer,
    DeadLetter,
    Lease,
    Pool,
    PoolItem,
    PoolStatus,
)
from freeride.pool.url import PoolUrl, parse_pool_url

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_TRIES",
    "Consumer",
    "DeadLetter",
    "Lease",
    "Pool",
    "PoolItem",
    "PoolStatus",
    "PoolUrl",
    "parse_lines",
    "parse_pool_url",
    "range_items",
]

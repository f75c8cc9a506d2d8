"""redis-py, imported when a pool is used: it is the `pool` extra (`pip install 'freeride[pool]'`), not a
dependency, so `import freeride`, the agent and every other command work without it."""

from __future__ import annotations

from types import ModuleType

from freeride.errors import PoolError

NEEDS_REDIS = "the work pool needs redis-py: pip install 'freeride[pool]'"


def redis_py() -> ModuleType:
    """The `redis` package, or PoolError with the one line that says how to install it."""
    try:
        import redis
    except ImportError:
        raise PoolError(NEEDS_REDIS) from None
    return redis

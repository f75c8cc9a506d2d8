"""`freeride pool …`: make a work pool from a file of items or a range, watch it, retry its dead letters, delete it.

freeride.pool, and with it redis (about 0.1 s to import), is imported inside the commands only, so
every other command starts without it. No output and no error line ever shows a password: the
URL's credentials and any `?password=` are masked, and masked again in whatever Redis says.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freeride.cli.common import UsageError, console, print_json
from freeride.core.secrets import scrub, secrets_in
from freeride.core.units import format_seconds
from freeride.errors import FreerideError, PoolError

if TYPE_CHECKING:
    from rich.console import Console

    from freeride.pool import Pool, PoolItem, PoolStatus

# freeride.pool's defaults, repeated here so that `--help` needs no redis (a test checks that they agree).
DEFAULT_LEASE_S = 30.0
DEFAULT_MAX_TRIES = 3
DEFAULT_DEAD_SHOWN = 10
_ERROR_CHARS = 160  # a dead letter's error line in the table; --json has all of it

URL_HELP = ("redis://[:PASSWORD@]HOST[:PORT][/DB]/NAME, rediss://… (TLS) or "
            "unix://[:PASSWORD@]/PATH/redis.sock/NAME[?db=N]")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`create`, `status`, `retry-failed`, `delete` under `freeride pool`."""
    c = sub.add_parser("create", help="create a pool and enqueue items (idempotent: an item id is enqueued once)")
    c.add_argument("url", metavar="URL", help=URL_HELP)
    source = c.add_mutually_exclusive_group(required=True)
    source.add_argument("--items", metavar="FILE",
                        help="one item per line: an id, or a JSON object with an \"id\" and its arguments; "
                             "- reads stdin; blank lines and #comments are skipped")
    source.add_argument("--range", type=int, metavar="N", help="items 0 … N-1 (a sweep that indexes its own table)")
    c.add_argument("--lease-s", type=_positive_float, metavar="S",
                   help=f"seconds a consumer holds an item before others may take it back "
                        f"(default {DEFAULT_LEASE_S:g}, or the pool's own when it exists)")
    c.add_argument("--max-tries", type=_positive_int, metavar="N",
                   help=f"failed attempts before an item goes to the dead letters "
                        f"(default {DEFAULT_MAX_TRIES}, or the pool's own when it exists)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_create)

    s = sub.add_parser("status", help="progress, rate and ETA, one row per consumer, the first dead letters")
    s.add_argument("url", metavar="URL", help=URL_HELP)
    s.add_argument("--dead", type=_count, default=DEFAULT_DEAD_SHOWN, metavar="N",
                   help=f"show the first N dead letters (default {DEFAULT_DEAD_SHOWN}; 0: none)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_status)

    r = sub.add_parser("retry-failed", help="put every dead letter back in the queue, its tries reset")
    r.add_argument("url", metavar="URL", help=URL_HELP)
    r.add_argument("--json", action="store_true", help="print JSON")
    r.set_defaults(func=cmd_retry_failed)

    d = sub.add_parser("delete", help="delete what Redis holds of a pool (never the items' outputs)")
    d.add_argument("url", metavar="URL", help=URL_HELP)
    d.add_argument("--force", action="store_true", help="delete it even while items are still pending")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=cmd_delete)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 0 or more")
    return int(text)


# -- the pool, its errors, and never a password ---------------------------------------------------
def _reason(exc: BaseException, secrets: list[str]) -> str:
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return scrub(text, secrets)


@contextmanager
def _open(text: str) -> Iterator[Pool]:
    """The pool at `text`. Anything wrong, here or in the body, becomes one PoolError line without a password."""
    from freeride.pool import Pool, parse_pool_url
    from freeride.pool.driver import redis_py

    redis = redis_py()  # PoolError, one line, without it
    secrets = secrets_in(text)
    where = "Redis"
    try:
        url = parse_pool_url(text)
        where = f"Redis at {url.safe_redis_url}"
        with Pool(url) as pool:
            yield pool
    except FreerideError as exc:
        raise PoolError(scrub(str(exc), secrets)) from None
    except redis.AuthenticationError as exc:
        if secrets:
            raise PoolError(f"{where} refused the credentials in the URL ({_reason(exc, secrets)}): "
                            "check the user name and password") from None
        raise PoolError(f"{where} requires a password and the URL gives none: put it in the URL, as in "
                        "redis://:PASSWORD@HOST[:PORT]/NAME or unix://:PASSWORD@/PATH/redis.sock/NAME") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise PoolError(f"{where} does not answer ({_reason(exc, secrets)}): check the URL and that "
                        "redis-server runs") from None
    except redis.InvalidResponse as exc:
        raise PoolError(f"{where} does not answer as Redis does ({_reason(exc, secrets)}): check the URL's host "
                        "and port") from None
    except redis.RedisError as exc:
        raise PoolError(f"{where} refused the request ({_reason(exc, secrets)})") from None


# -- create ---------------------------------------------------------------------------------------
def _read_items(ns: argparse.Namespace) -> list[PoolItem]:
    """Every item, checked before anything reaches Redis: a bad line 900 000 enqueues nothing."""
    from freeride.pool import parse_lines, range_items

    if ns.range is not None:
        return list(range_items(ns.range))
    if ns.items == "-":
        items = list(parse_lines(sys.stdin, source="stdin"))
        where = "stdin"
    else:
        path = Path(ns.items)
        try:
            with path.open(encoding="utf-8") as f:
                items = list(parse_lines(f, source=str(path)))
        except OSError as exc:
            raise UsageError(f"--items {path}: {exc.strerror or exc}; give a file with one item per line, "
                             "or - for stdin") from None
        except UnicodeDecodeError:
            raise UsageError(f"--items {path} is not UTF-8 text; give one item id or JSON object per line") from None
        where = str(path)
    if not items:
        raise UsageError(f"{where} holds no items: give one item id or JSON object per line")
    return items


def cmd_create(ns: argparse.Namespace) -> int:
    items = _read_items(ns)
    with _open(ns.url) as pool:
        lease_s, max_tries = ns.lease_s, ns.max_tries
        if lease_s is None or max_tries is None:  # keep what the pool was made with, unless told otherwise
            old_lease_s, old_max_tries = pool.settings() if pool.exists() else (DEFAULT_LEASE_S, DEFAULT_MAX_TRIES)
            lease_s = old_lease_s if lease_s is None else lease_s
            max_tries = old_max_tries if max_tries is None else max_tries
        added = pool.create(items, lease_s=lease_s, max_tries=max_tries)
        status = pool.status(dead_shown=0)
    if ns.json:
        print_json({"pool": status.url, "added": added, "given": len(items), "total": status.total,
                    "lease_s": status.lease_s, "max_tries": status.max_tries})
        return 0
    print(f"pool {status.url}: added {_items(added)} of {len(items)} given; it holds {_items(status.total)} "
          f"({status.done} done, {status.pending} pending, {status.failed} failed); "
          f"lease {status.lease_s:g} s, {status.max_tries} tries")
    return 0


def _items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


# -- status ---------------------------------------------------------------------------------------
def status_dict(s: PoolStatus) -> dict[str, Any]:
    """`pool status --json`: the same keys whatever the counts; numbers as numbers; eta_s null while no
    consumer works (no rate to go by)."""
    return {
        "pool": s.url, "total": s.total, "done": s.done, "pending": s.pending, "queued": s.queued,
        "in_flight": s.in_flight, "failed": s.failed, "items_per_s": s.items_per_s, "eta_s": s.eta_s,
        "lease_s": s.lease_s, "max_tries": s.max_tries, "created_unix": s.created_unix, "now_unix": s.now_unix,
        "consumers": [
            {"name": c.name, "host": c.host, "gpu": c.gpu, "task": c.task, "done": c.done, "failed": c.failed,
             "items_per_s": c.items_per_s, "busy_s": c.busy_s, "io_s": c.io_s, "io_share": _io_share(c.busy_s, c.io_s),
             "first_unix": c.first_unix, "last_unix": c.last_unix, "last_seen_s": max(0.0, s.now_unix - c.last_unix)}
            for c in s.consumers
        ],
        "dead": [{"id": d.item.id, "args": dict(d.item.args), "tries": d.tries, "error": d.error,
                  "consumer": d.consumer} for d in s.dead],
    }


def _io_share(busy_s: float, io_s: float) -> float:
    return io_s / (busy_s + io_s) if busy_s + io_s > 0 else 0.0


def _console() -> Console:
    """Rich's console (imported on use); piped output is not cut to 80 columns (an explicit COLUMNS still wins)."""
    return console()  # item ids and errors are not markup there


def _last_line(error: str) -> str:
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    line = lines[-1] if lines else "-"
    return line if len(line) <= _ERROR_CHARS else line[:_ERROR_CHARS - 1] + "…"


def cmd_status(ns: argparse.Namespace) -> int:
    with _open(ns.url) as pool:
        status = pool.status(dead_shown=ns.dead)
    if ns.json:
        print_json(status_dict(status))
        return 0
    from rich.table import Table

    console = _console()
    s = status
    totals = Table(title=f"pool {s.url} (lease {s.lease_s:g} s, {s.max_tries} tries)")
    for col in ("total", "done", "pending", "queued", "in flight", "failed", "items/s", "ETA"):
        totals.add_column(col, justify="right")
    eta = "finished" if not s.pending else format_seconds(s.eta_s) if s.eta_s is not None else "-"
    totals.add_row(str(s.total), str(s.done), str(s.pending), str(s.queued), str(s.in_flight), str(s.failed),
                   f"{s.items_per_s:.2f}", eta)
    console.print(totals)
    if s.consumers:
        ct = Table(title=f"consumers ({len(s.consumers)})")
        for col in ("host", "GPU", "task", "done", "failed", "items/s", "harvested", "queue I/O", "last seen"):
            ct.add_column(col, justify="left" if col in ("host", "GPU", "task") else "right")
        for c in s.consumers:
            ct.add_row(c.host or "-", c.gpu or "-", c.task or "-", str(c.done), str(c.failed), f"{c.items_per_s:.2f}",
                       format_seconds(c.busy_s), f"{_io_share(c.busy_s, c.io_s):.1%}",
                       f"{format_seconds(max(0.0, s.now_unix - c.last_unix))} ago")
        console.print(ct)
    elif s.pending:
        console.print(f"no consumer yet: submit a PoolTask with pool={s.url} (`freeride submit --all …`)",
                      soft_wrap=True)
    if s.dead:
        dt = Table(title=f"dead letters: first {len(s.dead)} of {s.failed}")
        for col in ("item", "tries", "last error"):
            dt.add_column(col, justify="right" if col == "tries" else "left")
        for d in s.dead:
            dt.add_row(d.item.id, str(d.tries), _last_line(d.error))
        console.print(dt)
        console.print(f"`freeride pool retry-failed {s.url}` queues them again", soft_wrap=True)
    return 0


# -- retry-failed, delete -------------------------------------------------------------------------
def cmd_retry_failed(ns: argparse.Namespace) -> int:
    with _open(ns.url) as pool:
        moved = pool.retry_failed()
        url = str(pool.url)
    if ns.json:
        print_json({"pool": url, "retried": moved})
    else:
        print(f"pool {url}: {_items(moved)} back in the queue from the dead letters")
    return 0


def cmd_delete(ns: argparse.Namespace) -> int:
    with _open(ns.url) as pool:
        s = pool.status(dead_shown=0)
        if s.pending and not ns.force:
            raise UsageError(f"pool {s.url} still has {_items(s.pending)} pending ({s.queued} queued, {s.in_flight} in "
                    "flight): wait until `freeride pool status` shows none, or pass --force to delete it anyway")
        pool.delete()
    if ns.json:
        print_json({"pool": s.url, "deleted": True, "total": s.total, "done": s.done, "pending": s.pending,
                    "failed": s.failed})
    else:
        print(f"deleted pool {s.url} ({s.done} of {_items(s.total)} done, {s.pending} pending, {s.failed} failed); "
              "the items' outputs are untouched")
    return 0

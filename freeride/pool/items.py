"""Items for `freeride pool create`: one id per line, JSON lines, or a range of numbers."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from freeride.errors import PoolError
from freeride.pool.queue import PoolItem

_MAX_ID = 512


def parse_lines(lines: Iterable[str], source: str = "items") -> Iterator[PoolItem]:
    """A line is an item id, or a JSON object with an "id" and either "args" (an object) or other fields
    (the arguments). Blank lines and lines starting with '#' are skipped."""
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PoolError(f"{source} line {number}: not JSON ({exc.msg}); give an id per line or a JSON "
                                'object like {"id": "a1", "path": "img/a1.jpg"}') from None
            if not isinstance(obj, dict) or "id" not in obj or isinstance(obj["id"], (dict, list, bool)):
                raise PoolError(f'{source} line {number}: a JSON item needs an "id" (a string or a number)')
            item_id = str(obj.pop("id"))
            args = obj.pop("args") if set(obj) == {"args"} else obj
            if not isinstance(args, dict):
                raise PoolError(f'{source} line {number}: "args" must be a JSON object')
        else:
            item_id, args = line, {}
        if len(item_id) > _MAX_ID:
            raise PoolError(f"{source} line {number}: item id longer than {_MAX_ID} characters")
        yield PoolItem(item_id, args)


def range_items(count: int) -> Iterator[PoolItem]:
    """Items "0" … "count-1" with no arguments (a parameter sweep indexes its own table)."""
    if count < 1:
        raise PoolError(f"--range needs a positive count, got {count}")
    return (PoolItem(str(i)) for i in range(count))

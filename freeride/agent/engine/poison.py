"""A pool item that kills its worker is charged the crash, not the task that ran it.

A pool task's worker writes the stream entry of the item it is processing into a marker beside its
checkpoint (`task-N.ckpt.item`, freeride/sdk/pool.py) and clears it when `process()` returns. A worker that
dies with the marker set died inside that item: the restarted worker counts the item one try (after the pool's
`max_tries` it is a dead letter), so the crash is the item's, and the task's restarts (`--max-restarts`) are
not spent on it: a pool task outlives any number of poison items.

Bounded all the same: an item whose crashes keep coming back past `MAX_CRASHES_PER_ITEM` (the pool could not
count its tries, say) is charged to the task again, so no crash loop runs for ever.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

MAX_CRASHES_PER_ITEM = 16  # well above any sensible max_tries: only a pool that cannot count tries reaches it
_MARK_BYTES = 64  # the marker holds one stream entry id (at most 41 characters), space-padded


def item_in_hand(marker: Path) -> str:
    """The entry of the item the task's last worker was processing when it died; "" if none (or no marker)."""
    try:
        with open(marker, "rb") as f:
            return f.read(_MARK_BYTES).decode(errors="replace").strip()
    except OSError:
        return ""


class ItemCrashes:
    """Per task, the crashes charged to each pool item."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self._dir = checkpoint_dir  # where each task's marker is: task-N.ckpt.item
        self._crashes: dict[str, Counter[str]] = {}

    def charge(self, task_id: str) -> str:
        """If the task's worker died inside a pool item (its marker names one), charge the item the crash and
        say so; "" for an ordinary crash (no item in hand, or the item has had its share: the task pays)."""
        entry = item_in_hand(self._dir / f"task-{task_id}.ckpt.item")
        if not entry:
            return ""
        counts = self._crashes.setdefault(task_id, Counter())
        counts[entry] += 1
        if counts[entry] > MAX_CRASHES_PER_ITEM:
            return ""
        return f"inside pool item {entry}, its crash {counts[entry]}: charged to the item, not to the task's restarts"

"""A crash inside a pool item is the item's, up to a bound (freeride/agent/engine/poison.py)."""

from __future__ import annotations

from pathlib import Path

from freeride.agent.engine.poison import MAX_CRASHES_PER_ITEM, ItemCrashes, item_in_hand


def test_the_marker_names_the_item_in_hand_and_a_cleared_or_missing_one_names_none(tmp_path: Path) -> None:
    marker = tmp_path / "task-1.ckpt.item"
    assert item_in_hand(marker) == ""  # no marker: not a pool task, or it never leased
    marker.write_bytes(b"1732000000000-7".ljust(48))
    assert item_in_hand(marker) == "1732000000000-7"
    marker.write_bytes(b" " * 48)  # process() returned: cleared
    assert item_in_hand(marker) == ""


def test_an_item_is_charged_its_crashes_until_the_bound_then_the_task_pays() -> None:
    crashes = ItemCrashes()
    assert [crashes.charge("1", "e-1") for _ in range(3)] == [1, 2, 3]
    assert crashes.charge("1", "e-2") == 1  # another item: its own count
    assert crashes.charge("2", "e-1") == 1  # another task: its own count
    for _ in range(MAX_CRASHES_PER_ITEM - 3):
        crashes.charge("1", "e-1")
    assert crashes.charge("1", "e-1") == 0  # past the bound: an ordinary crash, which spends a restart

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


def test_an_item_is_charged_its_crashes_until_the_bound_then_the_task_pays(tmp_path: Path) -> None:
    crashes = ItemCrashes(tmp_path)
    one, two = tmp_path / "task-1.ckpt.item", tmp_path / "task-2.ckpt.item"
    assert crashes.charge("1") == ""  # no item in hand: an ordinary crash
    one.write_bytes(b"e-1".ljust(48))
    two.write_bytes(b"e-1".ljust(48))
    assert [f"its crash {n}:" in crashes.charge("1") for n in (1, 2, 3)] == [True, True, True]
    assert crashes.charge("1").startswith("inside pool item e-1, its crash 4: charged to the item")
    assert "its crash 1:" in crashes.charge("2")  # another task: its own count
    for _ in range(MAX_CRASHES_PER_ITEM - 4):
        crashes.charge("1")
    assert crashes.charge("1") == ""  # past the bound: an ordinary crash, which spends a restart

"""The parallel run's order (tests/support/ordering.py): slow modules whole, at the fronts of worksteal's shares."""

from __future__ import annotations

from support.ordering import shares, slow_first


def test_the_shares_are_worksteals_first_split() -> None:
    assert shares(10, 3) == [3, 3, 4] and shares(9, 3) == [3, 3, 3] and shares(2, 3) == [0, 1, 1]


def _order(items: list[str], workers: int) -> list[str]:
    """Items named module.test; a test is slow when its name ends in '!'."""
    return slow_first(items, lambda i: i.split(".")[0], lambda i: i.endswith("!"), workers)


def test_slow_modules_go_whole_to_the_fronts_of_the_shares_and_the_rest_keeps_its_order() -> None:
    items = ["a.1", "a.2", "b.1", "b.2!", "b.3", "c.1", "d.1!", "e.1", "e.2", "f.1", "f.2", "g.1"]
    ordered = _order(items, 3)
    assert sorted(ordered) == sorted(items)  # nothing lost, nothing twice
    size = shares(len(items), 3)
    assert ordered[:size[0]] == ["b.1", "b.2!", "b.3", "a.1"]  # module b whole, then the rest in order
    assert ordered[size[0]:size[0] + size[1]] == ["d.1!", "a.2", "c.1", "e.1"]
    assert ordered[size[0] + size[1]:] == ["e.2", "f.1", "f.2", "g.1"]


def test_nothing_slow_or_one_worker_keeps_the_collection_order() -> None:
    items = ["a.1", "b.1!", "c.1"]
    assert _order(items, 1) == items and _order(items, 0) == items
    assert _order(["a.1", "b.1"], 3) == ["a.1", "b.1"]


def test_slow_modules_larger_than_their_shares_keep_every_item() -> None:
    items = ["a.1!", "a.2", "a.3", "a.4", "b.1", "c.1"]
    ordered = _order(items, 3)
    assert sorted(ordered) == sorted(items) and ordered[:4] == ["a.1!", "a.2", "a.3", "a.4"]

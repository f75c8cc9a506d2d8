"""What the worker sends of a task's progress(): the first 64 numbers with short keys, and a count of the rest."""

from __future__ import annotations

import logging

import pytest

from freeride.worker._progress import DROPPED, MAX_KEY_CHARS, MAX_KEYS, BoundedProgress


def test_a_small_progress_goes_as_it_is_and_nothing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    bound = BoundedProgress()
    raw = {"loss": 0.5, "step": 3, "inf": float("inf"), "ok": True}
    assert bound(raw) == {"loss": 0.5, "step": 3.0, "inf": float("inf"), "ok": 1.0}
    assert not caplog.records


def test_long_keys_and_non_numbers_are_dropped_and_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    bound = BoundedProgress()
    raw: dict[str, object] = {"k" * (MAX_KEY_CHARS + 1): 1.0, "name": "resnet", "none": None, "acc": 0.9}
    raw.update((f"m{i}", i) for i in range(MAX_KEYS))
    with caplog.at_level(logging.WARNING):
        first = bound(raw)
        second = bound(raw)
    assert first == second and len(first) == MAX_KEYS + 1 and first[DROPPED] == 3 + 1  # m63 is the 65th number
    assert "k" * (MAX_KEY_CHARS + 1) not in first and "acc" in first and "m62" in first and "m63" not in first
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"progress() returned {MAX_KEYS + 4} entries, 4 dropped (1 past the first 64 kept, 1 with "
                           f"keys over {MAX_KEY_CHARS} characters, 2 whose values are not numbers)")

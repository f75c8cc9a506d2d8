"""Specification of memory admission: resident caps never add up to more than the usable memory."""

from __future__ import annotations

from freeride.agent.admission import Admission, usable_bytes

GiB = 2**30
MiB = 2**20


def test_usable_memory_is_the_smaller_bound_minus_the_headroom() -> None:
    assert usable_bytes(trainer_free_bytes=10 * GiB, device_available_bytes=12 * GiB, headroom_bytes=GiB) == 9 * GiB
    assert usable_bytes(trainer_free_bytes=10 * GiB, device_available_bytes=6 * GiB, headroom_bytes=GiB) == 5 * GiB
    assert usable_bytes(trainer_free_bytes=0, device_available_bytes=6 * GiB, headroom_bytes=GiB) == 5 * GiB
    assert usable_bytes(trainer_free_bytes=3 * GiB, device_available_bytes=None, headroom_bytes=GiB) == 2 * GiB
    assert usable_bytes(trainer_free_bytes=GiB, device_available_bytes=None, headroom_bytes=2 * GiB) == 0


def test_nothing_bounds_memory_without_a_device_or_a_trainer_hint() -> None:
    assert usable_bytes(trainer_free_bytes=0, device_available_bytes=None, headroom_bytes=GiB) is None
    a = Admission()
    assert a.admit("1", 100 * GiB, lambda: None) == ""


def test_the_sum_of_admitted_caps_never_exceeds_the_usable_memory() -> None:
    a = Admission()
    assert a.admit("1", 3 * GiB, lambda: 4 * GiB) == ""
    why = a.admit("2", 2 * GiB, lambda: 4 * GiB)
    assert why == "waiting for memory: needs 2048 MiB, 1024 MiB free for side tasks"
    assert a.admit("3", GiB, lambda: 4 * GiB) == ""  # a smaller task still fits beside the first
    assert a.reserved_bytes == 4 * GiB
    a.release("1")
    assert a.admit("2", 2 * GiB, lambda: 4 * GiB) == ""
    assert a.reserved_bytes == 3 * GiB


def test_admitting_twice_reserves_once_and_uncapped_tasks_reserve_nothing() -> None:
    a = Admission()
    assert a.admit("1", GiB, lambda: 2 * GiB) == ""
    assert a.admit("1", GiB, lambda: 2 * GiB) == ""
    assert a.admit("2", 0, lambda: 0) == ""
    assert a.reserved == {"1": GiB, "2": 0}


def test_a_shrinking_budget_keeps_resident_tasks_and_holds_new_ones() -> None:
    a = Admission()
    assert a.admit("1", 2 * GiB, lambda: 4 * GiB) == ""
    assert a.admit("2", 1 * MiB, lambda: GiB).startswith("waiting for memory: needs 1 MiB, 0 MiB free")
    assert "1" in a.reserved

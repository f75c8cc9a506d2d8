"""Specification of memory admission: resident caps never add up to more than the usable memory."""

from __future__ import annotations

from freeride.agent.engine.admission import admit, usable_bytes

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
    assert admit(100 * GiB, 0, lambda: None) == ""


def test_the_sum_of_admitted_caps_never_exceeds_the_usable_memory() -> None:
    assert admit(3 * GiB, 0, lambda: 4 * GiB) == ""
    why = admit(2 * GiB, 3 * GiB, lambda: 4 * GiB)
    assert why == "waiting for memory: needs 2048 MiB, 1024 MiB free for side tasks"
    assert admit(GiB, 3 * GiB, lambda: 4 * GiB) == ""  # a smaller task still fits beside the first
    assert admit(1, 4 * GiB, lambda: 4 * GiB) != ""  # and then nothing more does
    assert admit(2 * GiB, 4 * GiB - 3 * GiB, lambda: 4 * GiB) == ""  # the 3 GiB task's worker exited


def test_an_uncapped_task_fits_without_asking_the_gpu() -> None:
    def no_query() -> int:
        raise AssertionError("an uncapped task must not cost a GPU query")

    assert admit(0, 10 * GiB, no_query) == ""


def test_a_shrinking_budget_keeps_resident_tasks_and_holds_new_ones() -> None:
    # 2 GiB admitted while 4 GiB were usable; now 1 GiB is: the resident task stays, a new one waits.
    assert admit(1 * MiB, 2 * GiB, lambda: GiB).startswith("waiting for memory: needs 1 MiB, 0 MiB free")

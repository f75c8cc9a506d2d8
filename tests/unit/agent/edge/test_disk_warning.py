"""A warning before the state disk is full: `freeride doctor` (and the agent's start) and /metrics.

On a real small file system (a tmpfs, tests/support/disk.py) filled by the test; skipped where it cannot be mounted.
"""

from __future__ import annotations

import errno
from pathlib import Path

from support.disk import fill, small_disk

from freeride.agent.control.histogram import Histogram
from freeride.agent.doctor import OK, WARN, disk_check
from freeride.agent.domain.views import GpuStats, Stats
from freeride.agent.edge.metrics import families
from freeride.agent.engine.front import MetricsView
from freeride.core import disk

MiB = 1 << 20


def _disk_gauges(usage: disk.Usage, warn_percent: int) -> dict[str, float]:
    view = MetricsView(Stats(GpuStats(), []), Histogram(), disk_warn_percent=warn_percent)
    return {f.name: f.samples[0].value for f in families(view, usage) if f.name.startswith("freeride_state_disk")}


def test_the_doctor_and_the_metrics_warn_once_the_state_disk_passes_the_threshold(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 4 * MiB) as mount:
        state = mount / "state"
        state.mkdir()
        empty = disk.usage(state)
        assert empty.total_bytes == 4 * MiB and empty.used_ratio < 0.05
        assert disk_check(state, 90).status == OK
        assert _disk_gauges(empty, 90)["freeride_state_disk_warning"] == 0

        fill(state / "filler", leave_bytes=MiB // 4)  # ~94 % used
        full = disk.usage(state)
        check = disk_check(state, 90)
        assert check.status == WARN and "at or above --disk-warn-percent 90" in check.detail
        assert "freeride prune" in check.fix and str(state) in check.detail
        gauges = _disk_gauges(full, 90)
        assert gauges["freeride_state_disk_warning"] == 1 and gauges["freeride_state_disk_used_ratio"] > 0.9
        assert gauges["freeride_state_disk_size_bytes"] == 4 * MiB
        assert gauges["freeride_state_disk_free_bytes"] == full.free_bytes <= MiB // 4
        assert _disk_gauges(full, 99)["freeride_state_disk_warning"] == 0  # the threshold is the operator's


def test_a_full_disk_is_told_apart_from_other_errors() -> None:
    assert disk.is_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk.is_full(OSError(errno.EMFILE, "Too many open files"))
    assert not disk.is_full(OSError(errno.EFBIG, "File too large"))  # a file size limit, not the disk
    assert not disk.is_full(RuntimeError("boom"))
    reason = disk.wait_reason("its checkpoint cannot be written to", "/s/checkpoints",
                              OSError(errno.ENOSPC, "No space left on device"))
    assert reason.startswith(f"{disk.WAIT_PREFIX}: ") and "(No space left on device)" in reason


def test_a_full_disk_says_whose_space_it_is_and_sends_to_rm_prune_only_when_freeride_holds_a_share(
    tmp_path: Path,
) -> None:
    """Filled by something else, `freeride rm/prune` cannot help: the reason says so, naming the file system."""
    full = OSError(errno.ENOSPC, "No space left on device")
    with small_disk(tmp_path / "disk", 4 * MiB) as mount:
        state = mount / "state"
        (state / "checkpoints").mkdir(parents=True)
        fill(mount / "someone-else")
        reason = disk.wait_reason("its checkpoint cannot be written to", state / "checkpoints", full, state)
        assert reason.startswith(f"{disk.WAIT_PREFIX}: its checkpoint cannot be written to {state / 'checkpoints'} "
                                 "(No space left on device); ")
        assert f"the file system at {mount} has 0 B free of 4.0 MiB" in reason, reason
        assert f"freeride's state {state} holds only 0 B of the 4.0 MiB used: something else filled it" in reason
        assert "rm/prune" not in reason

        (mount / "someone-else").unlink()
        fill(state / "checkpoints" / "task-1.ckpt")  # freeride's own state filled it
        reason = disk.wait_reason("its checkpoint cannot be written to", state / "checkpoints", full, state)
        assert f"freeride's state {state} holds 4.0 MiB of it: free space (freeride rm/prune)" in reason, reason
        assert "something else" not in reason

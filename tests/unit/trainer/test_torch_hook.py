"""The torch.distributed.pipelining hook, in-process: it reaches every module that holds the wait function
(a release whose runtime.py imported it by name), and it fails clearly, naming the version, when a hook
point is missing."""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed.pipelining.schedules as schedules

from freeride.trainer import torch_pipelining as tp
from freeride.trainer.waits import BETWEEN_STEPS_SLOT


class _Reporter:
    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass


class _Schedule:
    def __init__(self, stage: object) -> None:
        self._stage = stage

    def step(self) -> None:
        pass


def test_the_hook_replaces_the_wait_in_every_module_that_imported_it_by_name() -> None:
    pytest.importorskip("torch")
    import torch.distributed.pipelining.schedules as schedules

    from freeride.trainer import torch_pipelining as tp

    original = schedules._wait_batch_p2p
    # What a release with runtime.py looks like: `from .schedules import _wait_batch_p2p, _batch_p2p`.
    name = "torch.distributed.pipelining._freeride_test_runtime"
    runtime = types.ModuleType(name)
    runtime._wait_batch_p2p = original  # type: ignore[attr-defined]
    runtime._batch_p2p = schedules._batch_p2p  # type: ignore[attr-defined]
    sys.modules[name] = runtime
    try:
        before = tp.hook_points()["modules"]
        assert name in before["_wait_batch_p2p"] and "torch.distributed.pipelining.schedules" in before["_batch_p2p"]
        tp._install_hook()
        try:
            hooked: Any = runtime._wait_batch_p2p  # type: ignore[attr-defined]
            assert hooked is not original and hooked is schedules._wait_batch_p2p
            assert tp.hook_points()["modules"] == before  # the same modules, now holding the hook
        finally:
            tp._remove_hook()
        assert runtime._wait_batch_p2p is original and schedules._wait_batch_p2p is original  # type: ignore[attr-defined]
    finally:
        del sys.modules[name]


def test_a_torch_without_the_wait_function_is_refused_naming_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(schedules, "_wait_batch_p2p")
    with pytest.raises(tp.HookUnavailableError) as err:
        tp.instrument(_Schedule(object()), _Reporter())  # type: ignore[arg-type]
    assert str(err.value) == (f"torch {torch.__version__} has no torch.distributed.pipelining.schedules."
                              f"_wait_batch_p2p; freeride's hook is tested with torch {tp.TESTED_TORCH}")


def test_a_stage_without_the_receive_ops_is_refused_naming_the_version() -> None:
    class OldStage:
        def get_fwd_recv_ops(self, chunk: int) -> list[Any]:
            return []

    with pytest.raises(tp.HookUnavailableError,
                       match=re.escape(f"OldStage of torch {torch.__version__} has no get_bwd_recv_ops()")):
        tp.instrument(_Schedule(OldStage()), _Reporter())  # type: ignore[arg-type]
    assert tp._hook_users == 0  # nothing was left installed


class _CpuStage:
    device = torch.device("cpu")

    def get_fwd_recv_ops(self, chunk: int) -> list[Any]:
        return []

    get_bwd_recv_ops = get_fwd_recv_ops


def test_a_bad_edge_mode_is_refused_before_anything_is_installed() -> None:
    with pytest.raises(ValueError, match="edge_sync must be one of stream, event, off, not 'fast'"):
        tp.instrument(_Schedule(_CpuStage()), _Reporter(), edge_sync="fast")  # type: ignore[arg-type]
    assert tp._hook_users == 0


def test_on_a_cpu_stage_the_edges_are_the_cpu_wait_whatever_the_mode_asked() -> None:
    inst = tp.instrument(_Schedule(_CpuStage()), _Reporter(), edge_sync="event")  # type: ignore[arg-type]
    try:
        assert inst.edge_mode == "off"  # gloo blocks the CPU: the wait is exact, nothing to synchronise
    finally:
        inst.undo()


class _QuietReporter(_Reporter):
    """What the tracker of a CPU stage calls on its reporter; nothing is sent anywhere."""

    def hold(self) -> bool:
        return False

    def set_iteration(self, iteration: int) -> None:
        pass

    def start(self, *args: Any, **kwargs: Any) -> None:
        pass

    def end(self, *args: Any, **kwargs: Any) -> None:
        pass


class _PeerStage(_CpuStage):
    group_size = 2  # one of two ranks: a completed step must have waited for the other


class _Work:
    def wait(self) -> None:
        pass


class _StepSchedule(_Schedule):
    """A schedule whose step() does what it is told: wait for a peer (through the module's name, as torch's
    schedules do), raise, or neither."""

    def step(self, action: str = "wait") -> None:  # type: ignore[override]
        if action == "raise":
            raise _TrainingError("the user's own error")
        if action == "wait":
            schedules._wait_batch_p2p([_Work()])


class _TrainingError(RuntimeError):
    pass


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == tp.__name__ and r.levelno >= 40]


def test_a_first_step_that_raises_goes_up_untouched_and_leaves_the_instrumentation_in_place(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # a job of two ranks, as torchrun starts it
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    schedule = _StepSchedule(_PeerStage())
    users = tp._hook_users
    inst = tp.instrument(schedule, _QuietReporter(), record=True, min_report_us=0)  # type: ignore[arg-type]
    try:
        with pytest.raises(_TrainingError, match="the user's own error"):
            schedule.step("raise")
        assert _errors(caplog) == []  # the user's exception, not freeride's diagnosis
        assert "step" in vars(schedule) and tp._hook_users == users + 1  # still instrumented
        schedule.step("wait")
        assert [(b.iteration, b.slot) for b in inst.bubbles if b.slot != BETWEEN_STEPS_SLOT] == [(1, 0)]  # its wait
        assert _errors(caplog) == []
    finally:
        inst.undo()
    assert tp._hook_users == users


def test_a_step_that_completes_without_a_wait_is_diagnosed_naming_what_was_looked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schedule = _StepSchedule(_PeerStage())
    users = tp._hook_users
    inst = tp.instrument(schedule, _QuietReporter())  # type: ignore[arg-type]
    try:
        schedule.step("nothing")
    finally:
        inst.undo()
    [message] = _errors(caplog)
    assert message.startswith("freeride saw no pipeline wait in the first completed step() of _StepSchedule "
                              f"(a pipeline of 2 ranks; torch {torch.__version__}")
    assert ("it looks for calls of _wait_batch_p2p with works to wait on, hooked in "
            "torch.distributed.pipelining.schedules") in message
    assert "hook_points()" in message  # what to send, to say which torch does it elsewhere
    assert "step" not in vars(schedule) and tp._hook_users == users  # removed: it would only cost


def test_a_rank_alone_in_its_pipeline_is_not_diagnosed(caplog: pytest.LogCaptureFixture) -> None:
    schedule = _StepSchedule(_CpuStage())  # no peer stage, no process group: nobody to wait for
    inst = tp.instrument(schedule, _QuietReporter())  # type: ignore[arg-type]
    try:
        schedule.step("nothing")
        assert _errors(caplog) == [] and "step" in vars(schedule)
    finally:
        inst.undo()

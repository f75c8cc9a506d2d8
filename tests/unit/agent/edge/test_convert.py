"""Specification of the edge between messages and the engine's domain types (freeride.agent.edge.convert)."""

from __future__ import annotations

import pytest

from freeride.agent.domain.events import (
    Control,
    Edge,
    Share,
    Steps,
    TaskView,
    TrainerChanged,
    TrainerDeclaration,
    Waiting,
    WindowDone,
    WindowRecord,
    WorkerSetup,
)
from freeride.agent.domain.model import TaskRecord, TaskSpec, TaskState
from freeride.agent.domain.views import GpuMemory
from freeride.agent.edge.convert import (
    control_to_pb,
    declaration_from_pb,
    declaration_to_pb,
    edge_from_pb,
    event_to_pb,
    gpu_memory_to_pb,
    setup_to_pb,
    spec_from_pb,
    spec_to_pb,
    task_to_pb,
    window_to_pb,
    worker_message_from_pb,
)
from freeride.v1 import tasks_pb2, trainer_pb2, worker_pb2


@pytest.mark.parametrize(("edge", "start"), [(trainer_pb2.BUBBLE_EDGE_START, True),
                                             (trainer_pb2.BUBBLE_EDGE_END, False)])
def test_a_bubble_edge_keeps_every_field(edge: int, start: bool) -> None:
    ev = trainer_pb2.BubbleEvent(edge=edge, slot=3, iteration=9, stage=1, rank=2, time_ns=123, expected_duration_ns=45,
                                 free_memory_bytes=678, kind=trainer_pb2.BUBBLE_KIND_WARMUP)
    assert edge_from_pb(ev) == Edge(start, True, rank=2, slot=3, iteration=9, time_ns=123, expected_duration_ns=45,
                                    free_memory_bytes=678, kind=trainer_pb2.BUBBLE_KIND_WARMUP)


def test_a_hello_declares_the_pipeline_and_the_timeline_says_it_back() -> None:
    hello = trainer_pb2.TrainerHello(rank=2, stage=1, schedule="Interleaved1F1B", stages=4, microbatches=8,
                                     stages_per_rank=2)
    d = declaration_from_pb(hello)
    assert d == TrainerDeclaration(2, 1, "Interleaved1F1B", 4, 8, 2)
    back = declaration_to_pb(d)
    assert (back.rank, back.stage, back.schedule, back.stages, back.microbatches, back.stages_per_rank) == (
        2, 1, "Interleaved1F1B", 4, 8, 2)


def test_a_wait_between_schedule_steps_is_not_harvestable() -> None:
    ev = trainer_pb2.BubbleEvent(edge=trainer_pb2.BUBBLE_EDGE_START, kind=trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS)
    assert not edge_from_pb(ev).harvestable


def test_worker_messages_become_domain_messages() -> None:
    steps = worker_pb2.WorkerMessage(steps=worker_pb2.StepReport(
        window_id=4, steps=[worker_pb2.Step(start_ns=10, duration_ns=2), worker_pb2.Step(start_ns=12, duration_ns=3)],
        progress={"count": 2.0}, peak_memory_bytes=99,
    ))
    assert worker_message_from_pb(steps) == Steps(4, [(10, 2), (12, 3)], {"count": 2.0}, 99)
    done = worker_pb2.WorkerMessage(window_done=worker_pb2.WindowDone(window_id=4, idle_ns=777, step_estimate_ns=5,
                                                                     woke_ns=700))
    assert worker_message_from_pb(done) == WindowDone(4, idle_since_ns=777, step_estimate_ns=5, woke_ns=700)
    for waiting in (True, False):
        wait = worker_pb2.WorkerMessage(waiting=worker_pb2.WorkerWaiting(reason="db down", waiting=waiting))
        assert worker_message_from_pb(wait) == Waiting("db down", waiting)
    assert worker_message_from_pb(worker_pb2.WorkerMessage(hello=worker_pb2.WorkerHello(task_id="1"))) is None


def test_each_control_is_its_own_action() -> None:
    assert control_to_pb(Control.PAUSE).control.action == worker_pb2.CONTROL_ACTION_PAUSE
    assert control_to_pb(Control.CANCEL).control.action == worker_pb2.CONTROL_ACTION_CANCEL


def test_a_window_carries_its_steps_only_when_the_history_gave_them() -> None:
    share = Share("1", first_step_ns=10, idle_since_ns=20, steps=2, busy_ns=5, overrun_ns=0)
    record = WindowRecord(7, 0, 1, 2, 0, 30, 25, 28, (share, share._replace(step_spans=[(10, 2), (12, 3)])))
    pb = window_to_pb(record)
    assert [len(s.step_spans) for s in pb.shares] == [0, 2]
    assert pb.shares[0].idle_ns == 20  # the message's name for the instant the worker went idle
    stamped = window_to_pb(record._replace(seen_ns=3, shares=(share._replace(granted_ns=5, woke_ns=8),)))
    assert (stamped.seen_ns, stamped.shares[0].granted_ns, stamped.shares[0].woke_ns) == (3, 5, 8)
    assert event_to_pb(TrainerChanged(5, True, "peer", 1)).trainer.trainers == 1


def test_a_ready_task_holding_a_window_shows_as_running() -> None:
    rec = TaskRecord("1", TaskSpec("t", "m:T"), TaskState.READY)
    assert task_to_pb(TaskView(rec, True, 42, 1024)).state == tasks_pb2.TASK_STATE_RUNNING
    info = task_to_pb(TaskView(rec, False, 42, 1024, "/state/logs/task-7.log"))
    assert (info.state, info.pid, info.memory_bytes, info.log_path) == (
        tasks_pb2.TASK_STATE_READY, 42, 1024, "/state/logs/task-7.log")


def test_unbounded_usable_memory_is_minus_one_on_the_wire() -> None:
    m = GpuMemory(mode="cpu", mps="off", side_tasks_used_bytes=0, side_tasks_reserved_bytes=0, usable_bytes=None,
                  headroom_bytes=0, waiting_tasks=0)
    assert gpu_memory_to_pb(m).usable_bytes == -1


def test_every_answer_masks_a_password_and_only_the_worker_setup_carries_it() -> None:
    """spec_to_pb is the one place a stored spec becomes a reply (`ls --json`, `show --json`, Watch)."""
    url = "redis://:hunter2@redis-host:6379/0/pool"
    shown = spec_to_pb(TaskSpec(name="p", ref="m:P", args={"pool": url, "n": "3"}))
    assert dict(shown.args) == {"pool": "redis://:***@redis-host:6379/0/pool", "n": "3"}
    assert b"hunter2" not in shown.SerializeToString()
    setup = setup_to_pb(WorkerSetup(task_ref="m:P", args={"pool": url}, checkpoint_path="", checkpoint_interval_s=0.0,
                                    mem_limit_bytes=0))
    assert setup.setup.args["pool"] == url


def test_a_tasks_own_interpreter_crosses_the_edge_both_ways() -> None:
    pb = tasks_pb2.TaskSpec(name="hf", ref="m:Generate", python="/opt/hf/bin/python")
    spec = spec_from_pb(pb)
    assert spec.python == "/opt/hf/bin/python"
    assert spec_to_pb(spec).python == "/opt/hf/bin/python"
    assert spec_from_pb(tasks_pb2.TaskSpec(ref="m:T")).python == ""  # unset: the agent's own

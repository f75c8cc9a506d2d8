"""The one place where protobuf messages and the agent's domain objects meet.

The servicers (service.py) and the metrics collector call these; nothing below them sees a
message. `edge_from_pb` is on the bubble path: one NamedTuple construction per edge, nothing more.
"""

from __future__ import annotations

from typing import Any

from freeride.agent.domain.events import (
    AgentEvent,
    BubbleSpan,
    Checkpointed,
    Checkpointing,
    Control,
    Edge,
    Failed,
    Finished,
    IdleCpu,
    Ready,
    Steps,
    TaskChanged,
    TaskView,
    TrainerDeclaration,
    Waiting,
    WindowAccounted,
    WindowDone,
    WindowRecord,
    WorkerMessage,
    WorkerSetup,
)
from freeride.agent.domain.model import Counters, TaskSpec, TaskState
from freeride.agent.domain.views import GpuMemory, History, Stats
from freeride.agent.engine.retention import Removal
from freeride.core.secrets import mask
from freeride.v1 import tasks_pb2, trainer_pb2, worker_pb2

# protobuf enum values are ints at run time; the generated stubs type them as their enum class.
_STATE_TO_PB: dict[TaskState, Any] = {
    s: tasks_pb2.TaskState.Value(f"TASK_STATE_{s.value}") for s in TaskState
}
_PB_TO_STATE = {v: k for k, v in _STATE_TO_PB.items()}


def state_to_pb(state: TaskState) -> Any:
    return _STATE_TO_PB[state]


def state_from_pb(value: int) -> TaskState | None:
    return _PB_TO_STATE.get(value)


def spec_from_pb(spec: tasks_pb2.TaskSpec) -> TaskSpec:
    return TaskSpec(
        name=spec.name,
        ref=spec.ref,
        args=dict(spec.args),
        priority=spec.priority,
        mem_limit_bytes=spec.mem_limit_bytes,
        max_restarts=spec.max_restarts if spec.HasField("max_restarts") else -1,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        no_mps=spec.no_mps,
        python=spec.python,
    )


def spec_to_pb(spec: TaskSpec) -> tasks_pb2.TaskSpec:
    """The spec as callers see it: a password in an argument (a pool's redis://:PASSWORD@…) reads *** in every
    answer, table and JSON; only the task's worker gets it (setup_to_pb)."""
    return tasks_pb2.TaskSpec(
        name=spec.name,
        ref=spec.ref,
        args={key: mask(value) for key, value in spec.args.items()},
        priority=spec.priority,
        mem_limit_bytes=spec.mem_limit_bytes,
        max_restarts=spec.max_restarts if spec.max_restarts >= 0 else None,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        no_mps=spec.no_mps,
        python=spec.python,
    )


def counters_to_pb(c: Counters, step_estimate_ns: int = 0, peak_memory_bytes: int = 0) -> tasks_pb2.TaskCounters:
    return tasks_pb2.TaskCounters(
        steps=c.steps,
        harvested_s=c.harvested_ns / 1e9,
        overrun_s=c.overrun_ns / 1e9,
        overrun_steps=c.overrun_steps,
        windows=c.windows,
        killed_steps=c.killed_steps,
        step_estimate_s=step_estimate_ns / 1e9,
        peak_memory_bytes=peak_memory_bytes,
    )


def task_to_pb(view: TaskView) -> tasks_pb2.TaskInfo:
    rec = view.record
    state = TaskState.RUNNING if view.running and rec.state is TaskState.READY else rec.state
    return tasks_pb2.TaskInfo(
        id=rec.id,
        spec=spec_to_pb(rec.spec),
        state=state_to_pb(state),
        reason=rec.reason,
        restarts=rec.restarts,
        created_unix_s=rec.created_unix_s,
        updated_unix_s=rec.updated_unix_s,
        counters=counters_to_pb(rec.counters, rec.step_estimate_ns, rec.peak_memory_bytes),
        progress=rec.progress,
        checkpoint_steps=rec.checkpoint_steps,
        kind=rec.kind,
        pid=view.pid,
        memory_bytes=view.memory_bytes,
        log_path=view.log_path,
    )


def delete_to_pb(removal: Removal, view: TaskView) -> tasks_pb2.DeleteResponse:
    return tasks_pb2.DeleteResponse(task=task_to_pb(view), files_removed=removal.files, bytes_freed=removal.bytes)


def prune_to_pb(removal: Removal, views: list[TaskView]) -> tasks_pb2.PruneResponse:
    return tasks_pb2.PruneResponse(tasks=[task_to_pb(v) for v in views], files_removed=removal.files,
                                   bytes_freed=removal.bytes, dry_run=removal.dry_run)


# -- trainers --------------------------------------------------------------------------------------
_START = trainer_pb2.BUBBLE_EDGE_START
_BETWEEN_STEPS = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS


def edge_from_pb(ev: trainer_pb2.BubbleEvent) -> Edge:
    """An edge that limits.edge_ok accepted (its edge is START or END)."""
    return Edge(ev.edge == _START, ev.kind != _BETWEEN_STEPS, ev.rank, ev.slot, ev.iteration, ev.time_ns,
                ev.expected_duration_ns, ev.free_memory_bytes, ev.kind)


def declaration_from_pb(hello: trainer_pb2.TrainerHello) -> TrainerDeclaration:
    return TrainerDeclaration(hello.rank, hello.stage, hello.schedule, hello.stages, hello.microbatches,
                              hello.stages_per_rank)


# -- workers ---------------------------------------------------------------------------------------
def worker_message_from_pb(msg: worker_pb2.WorkerMessage) -> WorkerMessage | None:
    """None for a message that has no meaning after the hello (another hello, an empty body)."""
    which = msg.WhichOneof("body")
    if which == "steps":
        s = msg.steps
        return Steps(s.window_id, [(x.start_ns, x.duration_ns) for x in s.steps], dict(s.progress),
                     s.peak_memory_bytes)
    if which == "window_done":
        d = msg.window_done
        return WindowDone(d.window_id, d.idle_ns, d.step_estimate_ns, d.woke_ns)
    if which == "ready":
        return Ready(msg.ready.kind, msg.ready.resumed_steps, dict(msg.ready.progress))
    if which == "checkpointed":
        return Checkpointed(msg.checkpointed.steps, dict(msg.checkpointed.progress))
    if which == "finished":
        return Finished(dict(msg.finished.progress))
    if which == "failed":
        return Failed(msg.failed.reason, msg.failed.retryable)
    if which == "waiting":
        return Waiting(msg.waiting.reason, msg.waiting.waiting)
    if which == "checkpointing":
        return Checkpointing(msg.checkpointing.active)
    if which == "idle_cpu":
        return IdleCpu(msg.idle_cpu.cpu_ns, msg.idle_cpu.idle_ns) if msg.idle_cpu.idle_ns > 0 else None
    return None


_CONTROL_TO_PB = {Control.PAUSE: worker_pb2.CONTROL_ACTION_PAUSE, Control.CANCEL: worker_pb2.CONTROL_ACTION_CANCEL,
                  Control.CHECKPOINT: worker_pb2.CONTROL_ACTION_CHECKPOINT}


def control_to_pb(control: Control) -> worker_pb2.AgentCommand:
    return worker_pb2.AgentCommand(control=worker_pb2.Control(action=_CONTROL_TO_PB[control]))


def setup_to_pb(setup: WorkerSetup) -> worker_pb2.AgentCommand:
    return worker_pb2.AgentCommand(setup=worker_pb2.WorkerSetup(
        task_ref=setup.task_ref,
        args=setup.args,
        checkpoint_path=setup.checkpoint_path,
        checkpoint_interval_s=setup.checkpoint_interval_s,
        mem_limit_bytes=setup.mem_limit_bytes,
    ))


# -- history and live events -----------------------------------------------------------------------
def window_to_pb(w: WindowRecord) -> tasks_pb2.WindowRecord:
    record = tasks_pb2.WindowRecord(
        window_id=w.window_id, rank=w.rank, slot=w.slot, iteration=w.iteration, bubble_start_ns=w.bubble_start_ns,
        bubble_end_ns=w.bubble_end_ns, until_ns=w.until_ns, predicted_ns=w.predicted_ns, seen_ns=w.seen_ns,
    )
    for s in w.shares:
        share = record.shares.add(task_id=s.task_id, first_step_ns=s.first_step_ns, idle_ns=s.idle_since_ns,
                                  steps=s.steps, busy_ns=s.busy_ns, overrun_ns=s.overrun_ns,
                                  granted_ns=s.granted_ns, woke_ns=s.woke_ns)
        if s.step_spans:
            share.step_spans.extend(tasks_pb2.StepSpan(start_ns=a, duration_ns=d) for a, d in s.step_spans)
    return record


def bubble_to_pb(b: BubbleSpan) -> tasks_pb2.BubbleSpan:
    return tasks_pb2.BubbleSpan(rank=b.rank, slot=b.slot, iteration=b.iteration, start_ns=b.start_ns,
                                end_ns=b.end_ns, predicted_ns=b.predicted_ns, kind=b.kind)


def declaration_to_pb(d: TrainerDeclaration) -> tasks_pb2.TrainerDeclaration:
    return tasks_pb2.TrainerDeclaration(rank=d.rank, stage=d.stage, schedule=d.schedule, stages=d.stages,
                                        microbatches=d.microbatches, stages_per_rank=d.stages_per_rank)


def history_to_pb(h: History) -> tasks_pb2.TimelineResponse:
    return tasks_pb2.TimelineResponse(
        gpu=h.gpu, now_ns=h.now_ns, bubbles=[bubble_to_pb(b) for b in h.bubbles],
        windows=[window_to_pb(w) for w in h.windows], tasks=[task_to_pb(t) for t in h.tasks],
        trainers=[declaration_to_pb(d) for d in h.trainers],
    )


def event_to_pb(event: AgentEvent) -> tasks_pb2.AgentEvent:
    if isinstance(event, TaskChanged):
        return tasks_pb2.AgentEvent(time_ns=event.time_ns, task=task_to_pb(event.task))
    if isinstance(event, WindowAccounted):
        return tasks_pb2.AgentEvent(time_ns=event.time_ns, window=window_to_pb(event.record))
    change = tasks_pb2.TrainerChange(connected=event.connected, peer=event.peer, trainers=event.trainers,
                                     path=event.path)
    return tasks_pb2.AgentEvent(time_ns=event.time_ns, trainer=change)


# -- stats -----------------------------------------------------------------------------------------
def gpu_memory_to_pb(m: GpuMemory) -> tasks_pb2.GpuMemory:
    out = tasks_pb2.GpuMemory(
        mode=m.mode, mps=m.mps, side_tasks_used_bytes=m.side_tasks_used_bytes,
        side_tasks_reserved_bytes=m.side_tasks_reserved_bytes, trainer_peak_bytes=m.trainer_peak_bytes,
        usable_bytes=-1 if m.usable_bytes is None else m.usable_bytes,
        headroom_bytes=m.headroom_bytes, waiting_tasks=m.waiting_tasks,
    )
    d = m.device
    if d is not None:
        out.name, out.uuid, out.compute_mode = d.name, d.uuid, d.compute_mode
        out.total_bytes, out.used_bytes, out.free_bytes = d.total_bytes, d.used_bytes, d.free_bytes
        out.others_used_bytes = d.others_used_bytes
    return out


def stats_to_pb(stats: Stats) -> tasks_pb2.StatsResponse:
    g = stats.gpu
    return tasks_pb2.StatsResponse(
        gpu=tasks_pb2.GpuStats(
            gpu=g.gpu,
            bubbles=g.bubbles,
            bubble_s=g.bubble_ns / 1e9,
            harvested_s=g.harvested_ns / 1e9,
            overrun_s=g.overrun_ns / 1e9,
            overrun_steps=g.overrun_steps,
            steps=g.steps,
            windows=g.windows,
            windows_granted=g.windows_granted,
            events=g.events,
            prediction_error_p50=g.prediction_error_p50,
            uptime_s=g.uptime_ns / 1e9,
            training_s=g.training_ns / 1e9,
            dropped_events=g.dropped_events,
            rejected_events=g.rejected_events,
            trainer_free_memory_bytes=g.trainer_free_memory_bytes,
            trainers=g.trainers,
            event_delay_us_p50=g.event_delay_ns_p50 / 1e3,
            event_delay_us_p99=g.event_delay_ns_p99 / 1e3,
            memory=gpu_memory_to_pb(g.memory),
            trainer_streams=[
                tasks_pb2.TrainerStream(peer=t.peer, rank=t.rank, stage=t.stage, path=t.path, edges=t.edges,
                                        rejected=t.rejected, dropped=t.dropped, pid=t.pid)
                for t in g.trainer_streams
            ],
        ),
        tasks=[task_to_pb(t) for t in stats.tasks],
    )

"""The one place where protobuf messages and the agent's domain objects meet."""

from __future__ import annotations

from typing import Any

from freeride.agent.model import Counters, TaskRecord, TaskSpec, TaskState
from freeride.v1 import tasks_pb2

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
    )


def spec_to_pb(spec: TaskSpec) -> tasks_pb2.TaskSpec:
    return tasks_pb2.TaskSpec(
        name=spec.name,
        ref=spec.ref,
        args=spec.args,
        priority=spec.priority,
        mem_limit_bytes=spec.mem_limit_bytes,
        max_restarts=spec.max_restarts if spec.max_restarts >= 0 else None,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        no_mps=spec.no_mps,
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


def task_to_pb(rec: TaskRecord, running: bool = False) -> tasks_pb2.TaskInfo:
    state = TaskState.RUNNING if running and rec.state is TaskState.READY else rec.state
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
        pid=rec.pid,
        memory_bytes=rec.memory_bytes,
    )

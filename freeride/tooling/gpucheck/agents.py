"""A real agent for a check: the fake GPU in fake mode, the check's GPU otherwise, MPS on request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freeride.client import AgentClient
from freeride.tooling.gpucheck.model import FAKE_GPU_SPEC, CheckContext
from freeride.tooling.harness import AgentProcess, wait_for_info
from freeride.v1 import tasks_pb2

LIVE = (tasks_pb2.TASK_STATE_READY, tasks_pb2.TASK_STATE_RUNNING)
ENDED = (tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED, tasks_pb2.TASK_STATE_CANCELLED)
_START_S = 60.0


def mps_dirs(root: Path) -> tuple[Path, Path]:
    """A daemon's pipe and log directories under `root`."""
    return root / "mps" / "pipe", root / "mps" / "log"


def mps_args(program: str, root: Path) -> list[str]:
    """`freeride agent` flags for a daemon of its own in `root` (`--mps start`)."""
    pipe, logd = mps_dirs(root)
    return ["--mps", "start", "--mps-control", program, "--mps-pipe-dir", str(pipe), "--mps-log-dir", str(logd)]


def mps_client_env(root: Path) -> dict[str, str]:
    """What makes a process (the trainer stand-in) a client of the daemon in `root`."""
    pipe, logd = mps_dirs(root)
    return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logd)}


@contextlib.contextmanager
def running_agent(ctx: CheckContext, root: Path, extra: list[str], record: dict[str, Any]
                  ) -> Iterator[tuple[AgentProcess, AgentClient]]:
    """An agent in `root` (fast restarts, no headroom), stopped in order on the way out; `record` gets its
    exit code and the tail of its log. AgentUnavailableError if it does not come up."""
    args = ["--headroom", "0", "--restart-backoff-s", "0.05", *(["--fake-gpu", FAKE_GPU_SPEC] if ctx.fake else []),
            *extra]
    agent = AgentProcess(state_dir=root / "state", gpu=ctx.gpu, extra_args=args)
    record["agent_args"] = args
    try:
        agent.start(min(_START_S, ctx.left_s()))
        with agent.client() as client:
            yield agent, client
    finally:
        record["agent_exit_code"] = agent.stop()
        record["agent_log_tail"] = agent.log_tail(15)


def agent_alive(agent: AgentProcess, client: AgentClient) -> bool:
    """The agent's process runs and answers its health check."""
    if agent.proc is None or agent.proc.poll() is not None:
        return False
    try:
        client.health()
    except Exception:  # any failure to answer is the answer
        return False
    return True


def wait_live_or_ended(client: AgentClient, task_id: str, timeout_s: float) -> tasks_pb2.TaskInfo:
    """Block until the task's worker is up (or the task already ended, e.g. its setup failed)."""
    return wait_for_info(client, task_id, lambda t: t.state in LIVE or t.state in ENDED, timeout_s)


def task_record(info: tasks_pb2.TaskInfo) -> dict[str, Any]:
    """A task's state and counters as JSON data."""
    c = info.counters
    return {"id": info.id, "name": info.spec.name, "ref": info.spec.ref, "state": tasks_pb2.TaskState.Name(info.state),
            "reason": info.reason, "restarts": info.restarts, "pid": info.pid, "steps": c.steps,
            "harvested_s": round(c.harvested_s, 4), "windows": c.windows, "overrun_steps": c.overrun_steps,
            "step_estimate_ms": round(c.step_estimate_s * 1e3, 3), "peak_memory_bytes": c.peak_memory_bytes,
            "memory_bytes": info.memory_bytes, "progress": dict(info.progress), "log_path": info.log_path}

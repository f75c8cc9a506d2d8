"""`mps-mem-limit` (CUDA only): a CUDA side task under MPS, capped with --mem (the agent turns the cap into
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), allocates past its limit: the allocation must fail inside the task only
(FAILED with an out-of-memory reason), while the agent and a trainer stand-in (an MPS client of the same
daemon, allocating and running matmuls) keep running.
"""

from __future__ import annotations

from typing import Any

from freeride.errors import AgentUnavailableError
from freeride.tooling.gpucheck import agents
from freeride.tooling.gpucheck.checks.common import NO_MPS_BINARY, out_of_memory, program_note, read_json
from freeride.tooling.gpucheck.model import CheckContext, Outcome, failed, passed, skipped
from freeride.tooling.gpucheck.standin import StandIn, StandInError
from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2

_MiB = 2**20


def mps_mem_limit(ctx: CheckContext) -> Outcome:
    program = ctx.mps_program()
    if program is None:
        return skipped(NO_MPS_BINARY)
    cap_mib = 1024
    marker = ctx.work / "hog.json"
    details: dict[str, Any] = {**program_note(ctx, program), "cap_mib": cap_mib}
    try:
        with agents.running_agent(ctx, ctx.work / "agent", agents.mps_args(program, ctx.work), details) as (agent, c):
            details["mps"] = c.stats().gpu.memory.mps
            standin = StandIn({"target": agent.target, "device": "cuda", "gpu": ctx.gpu, "hold_mib": 1024},
                              ctx.work / "standin.log", env=agents.mps_client_env(ctx.work))
            with standin.start(min(90.0, ctx.left_s(30))):
                task = c.submit(tasks_pb2.TaskSpec(
                    name="mps-limit-probe", ref="freeride.tooling.gpucheck.tasks:GrowingHog", max_restarts=0,
                    mem_limit_bytes=cap_mib * _MiB,
                    args={"step_mib": "256", "step_ms": "2", "max_mib": str(3 * cap_mib), "device": "cuda",
                          "marker": str(marker)}))
                up = agents.wait_live_or_ended(c, task.id, min(120.0, ctx.left_s(20)))
                details["worker_pid"] = up.pid
                info = wait_for_task(c, task.id, agents.ENDED, ctx.left_s(20))
                details["task"] = agents.task_record(info)
                details["hog"] = read_json(marker)
                details["worker_env"] = details["hog"].get("env", {})  # as the worker saw it
                details["agent_alive_after"] = agents.agent_alive(agent, c)
                details["standin_ran_after"] = standin.wait_iterations(5, 15.0)
                details["standin"] = standin.stop()
    except (AgentUnavailableError, StandInError, TimeoutError) as exc:
        return failed(str(exc).splitlines()[0], **details)
    return _judge_limit(details, cap_mib)


def _judge_limit(details: dict[str, Any], cap_mib: int) -> Outcome:
    task, hog = details["task"], details["hog"]
    reason = task["reason"]
    oom = out_of_memory(reason)
    where = f"allocated {hog.get('allocated_mib')} MiB under a {cap_mib} MiB cap"
    problems = []
    if task["state"] != "TASK_STATE_FAILED" or not oom:
        what = ("the watchdog stopped it, not the MPS limit" if reason.startswith("memory_cap_exceeded")
                else "no out-of-memory error")
        problems.append(f"{what}: {task['state']} {reason[:160]!r}; {where}")
    if not details["agent_alive_after"]:
        problems.append("the agent did not survive")
    if not details["standin_ran_after"]:
        problems.append(f"the trainer stand-in stopped (exit {details['standin'].get('exit_code')})")
    if problems:
        return failed("; ".join(problems), **details)
    return passed(f"OOM inside the task at {hog.get('allocated_mib')} MiB + 256 (cap {cap_mib} MiB, "
                  f"{details['worker_env'].get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}); agent and trainer stand-in "
                  "kept running", **details)

"""`watchdog`: a task that grows past its memory cap is stopped by the agent's watchdog and FAILED with
memory_cap_exceeded, while the agent and a trainer stand-in (the process that must never be touched) run on.

Two phases, each with an agent of its own: without MPS, then with an MPS daemon the agent starts (the real
control program on a GPU run, if on PATH; the stand-in with --fake-gpu). On CUDA the task allocates GPU memory
past the torch memory fraction the worker set; under MPS the pinned limit may fail an allocation before the
watchdog samples: whichever stops it is recorded. On CUDA, NVML's per-process lists are sampled meanwhile
and each pid they credit is named (worker, MPS server, trainer stand-in, agent). With --fake-gpu the fake
GPU counts the worker's resident memory, so the same path runs for real on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from freeride.errors import AgentUnavailableError
from freeride.gpu.mps import MpsControl, MpsError
from freeride.tooling.gpucheck import agents
from freeride.tooling.gpucheck.checks.common import out_of_memory, read_json
from freeride.tooling.gpucheck.model import CheckContext, Outcome, failed, passed
from freeride.tooling.gpucheck.nvmlsample import NvmlSampler
from freeride.tooling.gpucheck.standin import StandIn, StandInError
from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2

_MiB = 2**20


@dataclass(frozen=True)
class _Hog:
    """The growing task's cap and its GrowingHog arguments."""

    cap_mib: int
    step_mib: int
    step_ms: float
    hold_mib: int  # a plateau below the cap, for NVML to be sampled at
    hold_steps: int
    max_mib: int  # twice the cap: a watchdog that never fires leaves it holding there

    def args(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if k != "cap_mib"}


# Resident memory: the worker holds ~40-60 MiB before it allocates. Small steps: on a VM a page fault can cost
# 8 us, so 8 MiB took up to 20 ms, and the task waited for a bubble its steps no longer fitted.
_FAKE = _Hog(200, 4, 5.0, 64, 10, 400)
_CUDA = _Hog(2048, 128, 5.0, 1024, 40, 4096)  # NVML's per-process figure includes the CUDA context (~0.5 GiB)
_FAKE_BUBBLE_MS = 50.0  # the stand-in's bubble in fake mode: several of the task's steps, however slow the faults


def watchdog(ctx: CheckContext) -> Outcome:
    program = ctx.mps_program()
    phases: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, use_mps in (("no-mps", False), ("mps", True)):
        if use_mps and program is None:
            phases[name] = {"skipped": "nvidia-cuda-mps-control is not on PATH"}
            continue
        share = 0.5 if name == "no-mps" and program is not None else 1.0
        record = _phase(ctx, name, program if use_mps else None, ctx.left_s(5) * share)
        phases[name] = record
        problems += [f"{name}: {p}" for p in record.pop("problems")]
    details: dict[str, Any] = {"phases": phases}
    if ctx.fake:
        details["note"] = "fake mode: the fake GPU and the stand-in MPS control program"
    ran = {n: r for n, r in phases.items() if "skipped" not in r}
    summary = "; ".join(_phase_line(n, r) for n, r in ran.items())
    if "skipped" in phases.get("mps", {}):
        summary += "; mps phase skipped: " + phases["mps"]["skipped"]
    if problems:
        return failed("; ".join(problems), summary, **details)
    return passed(summary, **details)


def _phase_line(name: str, r: dict[str, Any]) -> str:
    credited = f", NVML credited {', '.join(r['credited'])}" if r.get("credited") else ""
    reason = r.get("task", {}).get("reason", "")
    return (f"{name} ({r.get('memory_mode')}): stopped by {r.get('stopped_by')} ({reason[:90]}; task allocated "
            f"{r.get('hog', {}).get('allocated_mib')} MiB){credited}")


def _phase(ctx: CheckContext, name: str, program: str | None, budget_s: float) -> dict[str, Any]:
    root = ctx.work / name
    plan = _CUDA if ctx.cuda else _FAKE
    cap_mib = plan.cap_mib
    marker = root / "hog.json"
    record: dict[str, Any] = {"cap_mib": cap_mib, "mps": program is not None, "problems": []}
    # Workers at nice 0: what is checked is the memory cap, and at nice 19 (their sessions too, fix 59) the growing
    # task got next to no CPU beside the stand-in trainer on a loaded 2-core rehearsal, so it never grew.
    extra = ["--worker-nice", "0", *(agents.mps_args(program, root) if program else [])]
    env = agents.mps_client_env(root) if program else {}
    sampler = NvmlSampler(ctx.gpu) if ctx.cuda else None
    try:
        with agents.running_agent(ctx, root, extra, record) as (agent, c):
            record["memory_mode"] = c.stats().gpu.memory.mode  # nvml, fake (resident memory) or cpu (the same)
            standin = StandIn({"target": agent.target, "device": "cuda" if ctx.cuda else "cpu", "gpu": ctx.gpu,
                               "hold_mib": 512 if ctx.cuda else 0,
                               **({} if ctx.cuda else {"bubble_ms": _FAKE_BUBBLE_MS})}, root / "standin.log", env=env)
            with standin.start(min(90.0, budget_s / 2)):
                args = plan.args()
                args.update(device="cuda" if ctx.cuda else "cpu", marker=str(marker))
                task = c.submit(tasks_pb2.TaskSpec(name=f"hog-{name}", ref="freeride.tooling.gpucheck.tasks:GrowingHog",
                                                   args=args, mem_limit_bytes=cap_mib * _MiB, max_restarts=0))
                if sampler is not None:
                    sampler.start()
                up = agents.wait_live_or_ended(c, task.id, min(120.0, budget_s / 2))
                if program is not None:
                    record["mps_servers"] = _servers(program, root)  # now: a server is listed while clients run
                info = wait_for_task(c, task.id, agents.ENDED, min(60.0, budget_s / 2))
                if sampler is not None:
                    sampler.stop()
                record["task"] = agents.task_record(info)
                record["worker_pid"] = up.pid
                record["hog"] = read_json(marker)
                record["agent_alive_after"] = agents.agent_alive(agent, c)
                record["standin_ran_after"] = standin.wait_iterations(3, 15.0)
                record["standin"] = standin.stop()
            if sampler is not None:
                roles = {up.pid: "worker", standin.pid: "trainer stand-in",
                         **({agent.proc.pid: "agent"} if agent.proc else {}),
                         **{pid: "MPS server" for pid in record.get("mps_servers", [])}}
                record["nvml"] = sampler.attribution(roles)
                record["credited"] = sorted({f"{p['role']} ({p['list']} list)" for p in record["nvml"]["processes"]})
        if program is not None:
            record["terminate_client_before_kill"] = _terminated(root, up.pid)
    except (AgentUnavailableError, StandInError, TimeoutError) as exc:
        record["problems"].append(str(exc).splitlines()[0])
        return record
    finally:
        if sampler is not None:
            sampler.stop()
    _judge(record, ctx, program is not None)
    return record


def _judge(record: dict[str, Any], ctx: CheckContext, mps: bool) -> None:
    task = record["task"]
    reason = task["reason"]
    oom = out_of_memory(reason)
    if task["state"] == "TASK_STATE_FAILED" and reason.startswith("memory_cap_exceeded"):
        record["stopped_by"] = "watchdog"
    elif task["state"] == "TASK_STATE_FAILED" and oom:
        record["stopped_by"] = "MPS pinned limit (out of memory)"
    else:
        record["stopped_by"] = "nothing"
    ok_stops = ("watchdog", "MPS pinned limit (out of memory)") if (mps and ctx.cuda) else ("watchdog",)
    if record["stopped_by"] not in ok_stops:
        record["problems"].append(f"ended {task['state']} {reason[:160]!r}, not memory_cap_exceeded")
    if not record["agent_alive_after"]:
        record["problems"].append("the agent did not survive")
    if not record["standin_ran_after"]:
        record["problems"].append(f"the trainer stand-in stopped (exit {record['standin'].get('exit_code')})")
    if mps and ctx.fake and record.get("terminate_client_before_kill") is not True:
        record["problems"].append("the stand-in daemon's control.log shows no terminate_client for the worker")


def _servers(program: str, root: Path) -> list[int]:
    pipe, logd = agents.mps_dirs(root)
    try:
        return MpsControl(program, pipe, logd, timeout_s=10).servers()
    except MpsError:
        return [p.pid for p in psutil.process_iter() if "mps-server" in _name(p)]


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


def _terminated(root: Path, pid: int) -> bool | None:
    """Whether the daemon's control log shows terminate_client for the worker (the stand-in's log says so;
    the real daemon's control.log may word it otherwise: None when no line names it)."""
    _, logd = agents.mps_dirs(root)
    try:
        lines = (logd / "control.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    hits = [ln for ln in lines if "terminate_client" in ln and str(pid) in ln]
    return True if hits else None

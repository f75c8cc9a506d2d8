"""`sidetasks`: every shipped side task, with device=cuda, makes progress in a real agent's bubbles.

One agent on the check's GPU; the five tasks (batch generation with a KV cache among them) are submitted
together, their workers come up (each sets up on the GPU), then a trainer stand-in reports a 40 ms bubble
every 50 ms until each task has run steps (or finished). Passed when every task's steps grew and none failed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from freeride.client import AgentClient
from freeride.errors import AgentUnavailableError
from freeride.tooling.gpucheck import agents
from freeride.tooling.gpucheck.model import CheckContext, Outcome, failed, passed
from freeride.tooling.gpucheck.standin import StandIn, StandInError
from freeride.tooling.harness import wait_for
from freeride.v1 import tasks_pb2

_STEPS = 10  # each task's steps (or done) before the wait ends early
_BUBBLE_MS, _COMPUTE_MS = 40.0, 10.0


def shipped(ctx: CheckContext) -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (reference, arguments): the bundled tasks (docs/sidetasks.md), short runs, on the GPU."""
    return {
        "digits-resnet": ("sidetasks.cnn:DigitsResNet", {"device": "cuda", "epochs": "2"}),
        "pagerank": ("sidetasks.pagerank:PageRank", {"device": "cuda"}),
        "components": ("sidetasks.components:ConnectedComponents", {"device": "cuda"}),
        "thumbnails": ("sidetasks.images:Thumbnails", {"device": "cuda", "images": "200",
                                                       "out_dir": str(ctx.work / "thumbnails")}),
        "generate": ("sidetasks.generate:Generate", {"device": "cuda", "prompts": str(_prompts(ctx)),
                                                     "out": str(ctx.work / "generate.jsonl"), "max_new_tokens": "32"}),
    }


def _prompts(ctx: CheckContext) -> Path:
    """The batch generation task's prompts (JSON lines, one a prompt): 200 short ones, enough for ten steps."""
    path = ctx.work / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    words = ("def", "class", "import", "return", "while", "lambda", "yield", "with")
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": " ".join(words[: i % 8 + 1])}) + "\n"
                            for i in range(200)))
    return path


def sidetasks(ctx: CheckContext) -> Outcome:
    details: dict[str, Any] = {"bubble_ms": _BUBBLE_MS, "compute_ms": _COMPUTE_MS}
    try:
        with agents.running_agent(ctx, ctx.work / "agent", [], details) as (agent, c):
            ids = {name: c.submit(tasks_pb2.TaskSpec(name=name, ref=ref, args=args, max_restarts=0)).id
                   for name, (ref, args) in shipped(ctx).items()}
            t0 = time.monotonic()
            for task_id in ids.values():  # side by side: the last one up ends the wait
                agents.wait_live_or_ended(c, task_id, max(1.0, min(150.0, ctx.left_s(40)) - (time.monotonic() - t0)))
            details["setup_s"] = round(time.monotonic() - t0, 1)
            before = {name: c.get(i).counters.steps for name, i in ids.items()}
            standin = StandIn({"target": agent.target, "device": "cpu", "bubble_ms": _BUBBLE_MS,
                               "compute_ms": _COMPUTE_MS},
                              ctx.work / "standin.log")
            with standin.start(30.0):
                t1 = time.monotonic()
                _wait_progress(c, list(ids.values()), min(45.0, ctx.left_s(15)))
                details["harvest_s"] = round(time.monotonic() - t1, 1)
                details["standin"] = standin.stop()
            details["tasks"] = {name: {**agents.task_record(c.get(i)), "steps_before": before[name]}
                                for name, i in ids.items()}
    except (AgentUnavailableError, StandInError, TimeoutError) as exc:
        return failed(str(exc).splitlines()[0], **details)
    return _judge(details)


def _wait_progress(c: AgentClient, ids: list[str], timeout_s: float) -> None:
    """Block until each task ran `_STEPS` steps, finished or failed, driven by the agent's events (or time out)."""

    def settled() -> bool | None:
        infos = [c.get(i) for i in ids]
        return True if all(t.counters.steps >= _STEPS or t.state in agents.ENDED for t in infos) else None

    def on_event(ev: tasks_pb2.AgentEvent) -> bool | None:
        return settled() if ev.HasField("task") or ev.HasField("window") else None

    wait_for(c, settled, on_event, timeout_s)


def _judge(details: dict[str, Any]) -> Outcome:
    tasks = details["tasks"]
    problems = []
    for name, t in tasks.items():
        if t["state"] == "TASK_STATE_FAILED":
            problems.append(f"{name} FAILED: {t['reason'][:160]}")
        elif t["steps"] <= t["steps_before"] and t["state"] != "TASK_STATE_DONE":
            problems.append(f"{name} made no progress ({t['state']} {t['reason'][:80]})")
    summary = ", ".join(f"{name} {t['steps']} steps {t['harvested_s']:.2f} s" + (" done" if t["state"] ==
                        "TASK_STATE_DONE" else "") for name, t in tasks.items())
    if problems:
        return failed("; ".join(problems), summary, **details)
    return passed(summary, **details)

"""`freeride bench trainer --framework deepspeed --startup-runs N`: what an instrumented job costs from its start.

The alternating bench (trainer.py) measures the hooks in one long run; a job's own start (instrument(), the
reporter's connection, the agent's handshake, the first steps) is not in it. Here each job is a run of its own:
N plain jobs and N instrumented ones, alternated back to back (plain, instrumented, plain, ...), in three
settings: no agent at all; an agent with nothing to grant; an agent with a task whose steps fit none of the
job's bubbles (a SleepTask of `--startup-task-ms`). Each job is its ranks' own interpreters (not forked from one
that imported DeepSpeed first) and trains at once, as a real one does (no wait for the
connection). The first FIRST steps and the steps after them (steady state) are reported apart: each as the
median over the pairs of (instrumented job / plain job) for the mean step time, the training thread's CPU per
step and the whole process's CPU per step (the reporter's and gRPC's threads too), with the same figure for
plain jobs against each other (null: the machine's noise).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freeride.tooling.bench import paths
from freeride.tooling.bench.pipeline import PipelineConfig, launch
from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

FIRST = 30  # the start-up: the first steps of a job
SETTINGS = ("no_agent", "agent_idle", "agent_task_fits_none")


@contextlib.contextmanager
def _agents(setting: str, root: Path, stages: int, task_ms: float) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if setting != "no_agent":
            for r in range(stages):
                agent = stack.enter_context(AgentProcess(state_dir=root / f"state{r}", gpu=r,
                                                         extra_args=paths.AGENT_ARGS))
                if setting == "agent_task_fits_none":
                    with agent.client() as client:
                        spec = tasks_pb2.TaskSpec(name="long-steps", ref="freeride.tooling.tasks:SleepTask",
                                                  args={"step_ms": str(task_ms)})
                        task = client.submit(spec)
                        wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY], timeout_s=120)
        yield


def _job(res: list[dict[str, Any]], key: str, part: slice) -> float:
    """A job's mean per step over its ranks, for `key` in the steps of `part`."""
    per_rank = [statistics.mean(r[key][part]) for r in res]
    return statistics.mean(per_rank)


def settings(text: str) -> tuple[str, ...]:
    """`--startup-settings`: a comma-separated subset of SETTINGS, run in SETTINGS' order; ValueError otherwise."""
    given = [word.strip() for word in text.split(",") if word.strip()]
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown or not given:
        raise ValueError(f"--startup-settings takes some of {', '.join(SETTINGS)}, comma-separated"
                         + (f" (not {', '.join(unknown)})" if unknown else ""))
    return tuple(s for s in SETTINGS if s in given)


def job_ratios(plain: list[float], inst: list[float]) -> dict[str, Any]:
    """One figure over the runs: the medians of plain and instrumented jobs, the median of the pairs' ratios (job k
    instrumented / job k plain, each pair back to back), and the null: the median of consecutive plain jobs' ratios
    (None with one run)."""
    pairs = [i / p for p, i in zip(plain, inst, strict=True)]
    null = [b / a for a, b in itertools.pairwise(plain)]
    return {"plain": round(statistics.median(plain), 3), "instrumented": round(statistics.median(inst), 3),
            "ratio": round(statistics.median(pairs), 4), "ratios": [round(x, 4) for x in pairs],
            "null_ratio": round(statistics.median(null), 4) if null else None}


def run(ns: argparse.Namespace, cfg: PipelineConfig, path: str) -> dict[str, Any]:
    runs = ns.startup_runs
    cfg = dataclasses.replace(cfg, alternate=False, record=False, wait_connected=False)
    first, steady = slice(0, FIRST), slice(FIRST, None)
    out: dict[str, Any] = {}
    for setting in ns.startup_settings:
        with tempfile.TemporaryDirectory(prefix="freeride-bench-") as tmp:
            root = Path(tmp)
            job = dataclasses.replace(cfg, socket_dir=str(root))
            with _agents(setting, root, cfg.stages, ns.startup_task_ms):
                if setting != "no_agent":  # the agents learn the job's bubbles (and the task's steps) first
                    launch(dataclasses.replace(job, instrument=True), root / "learn", fork=False)
                jobs: dict[bool, list[list[dict[str, Any]]]] = {False: [], True: []}
                for k in range(runs):
                    for instrument in (False, True):
                        jobs[instrument].append(launch(dataclasses.replace(job, instrument=instrument),
                                                       root / f"run{k}{int(instrument)}", fork=False))
        figures: dict[str, Any] = {}
        for name, part in (("first", first), ("steady", steady)):
            figures[name] = {key: job_ratios([_job(r, key, part) for r in jobs[False]],
                                          [_job(r, key, part) for r in jobs[True]])
                             for key in ("step_ms", "step_cpu_ms", "step_process_cpu_ms")}
        last = jobs[True][-1]
        figures["instrument_ms"] = round(statistics.median(r["instrument_ms"] for j in jobs[True] for r in j), 3)
        figures["untimed_share"] = round(statistics.mean(r["untimed_steps"] for j in jobs[True] for r in j)
                                         / cfg.iterations, 4)
        figures["paths"] = [r["reporter_path"] for r in last]
        out[setting] = figures
    return {"benchmark": "trainer-startup", "framework": cfg.framework, "path": path, "model": cfg.model,
            "p": cfg.stages, "m": cfg.microbatches, "dim": cfg.dim, "microbatch_size": cfg.microbatch_size,
            "iterations": cfg.iterations, "first_steps": FIRST, "runs": runs, "quiet_sample_ms": cfg.quiet_sample_ms,
            "task_step_ms": ns.startup_task_ms, "cpus": ",".join(map(str, cfg.cpus)) or "any", **out}

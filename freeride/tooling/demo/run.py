"""`freeride demo`: a real 4-stage pipeline training a small transformer, with side tasks in its bubbles.

One agent per stage (temporary state dir, unix sockets), the side tasks submitted to each, and a
real torch.distributed.pipelining 1F1B run (gloo on CPU; `--device cuda` on GPUs) of a byte-level
language model, instrumented with freeride. Training alternates blocks of iterations that do not
report bubbles (baseline: no side-task step can run) with blocks that do (harvest), so the cost of
harvesting is measured in the same run. At the end: a report (tables, JSON), timeline.png and the
pipeline's bubble profile (profile.png, profile.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from freeride.agent.config import MAX_CHECK_TIMEOUT_S
from freeride.cli.common import UsageError
from freeride.client import AgentClient
from freeride.tooling.bench.pipeline import PipelineRun
from freeride.tooling.demo import report as demo_report
from freeride.tooling.demo.plan import Plan, SideTask, make_plan
from freeride.tooling.harness import AgentProcess, WindowCollector, wait_for_task
from freeride.tooling.profile import analysis, recording, render
from freeride.v1 import tasks_pb2

T = TypeVar("T")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or SIGTERM: leave through the cleanup of everything started, and let a second one not cut it short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def cmd_demo(ns: argparse.Namespace) -> int:
    plan = make_plan(ns)
    console = Console(stderr=ns.json)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    # Each process of the demo gets one BLAS thread: on a CPU a stage's rank and workers share one core.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if plan.cpus:
            os.environ[var] = "1"
        else:
            os.environ.setdefault(var, "1")
    try:
        report = run(plan, console)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            plan.out_dir.rmdir()  # only if nothing was written there
        console.print("interrupted: every process the demo started has been stopped")
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        demo_report.show(console, report)
    return 0


def _in_parallel(fns: list[Callable[[], T]]) -> list[T]:
    """Run blocking calls side by side (agent start-up, submissions: each waits on a child process)."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@contextlib.contextmanager
def _agents(root: Path, plan: Plan, console: Console) -> Iterator[list[AgentProcess]]:
    """One agent per stage; on a CPU its workers pinned to its stage's core, at the plan's priority."""
    stages = plan.pipeline.stages
    workers = ["--worker-nice", str(plan.worker_nice), "--worker-sched", plan.worker_sched]
    # Every side task is submitted at once, so each agent checks its tasks side by side, each check a process
    # importing torch: on a loaded 2-core machine one took over the default 20 s. The demo's tasks are known to
    # import quickly otherwise, so their checks get the longest time an agent allows.
    checks = ["--check-timeout-s", f"{MAX_CHECK_TIMEOUT_S:g}"]
    procs = [
        AgentProcess(state_dir=root / f"state{s}", gpu=s, new_session=True,
                     extra_args=["--shutdown-grace-s", "5", *checks, *workers,
                                 *(["--worker-cpus", str(plan.cpus[s])] if plan.cpus else [])])
        for s in range(stages)
    ]
    try:
        with console.status(f"starting {stages} agents, one per pipeline stage"):
            for p in procs:
                p.spawn()  # here, not in a thread: an interrupt cannot leave one unstopped
            _in_parallel([p.wait_ready for p in procs])
        yield procs
    finally:
        with console.status("stopping agents and side-task workers"):
            _in_parallel([p.stop for p in procs])


def _submit(plan: Plan, clients: list[AgentClient], console: Console) -> dict[int, dict[str, tasks_pb2.TaskInfo]]:
    """Every stage's side tasks, submitted and READY."""
    jobs: list[tuple[int, SideTask]] = [(s, t) for s, ts in plan.tasks.items() for t in ts]

    def submit(stage: int, task: SideTask) -> tasks_pb2.TaskInfo:
        device = "auto" if plan.pipeline.device == "cuda" else "cpu"
        args = {k: v.format(out=plan.out_dir, stage=stage, device=device) for k, v in task.args.items()}
        info = clients[stage].submit(tasks_pb2.TaskSpec(name=task.name, ref=task.ref, args=args))
        return wait_for_task(clients[stage], info.id, [tasks_pb2.TASK_STATE_READY], timeout_s=120)

    with console.status(f"submitting {len(jobs)} side tasks ({', '.join(sorted({t.name for _, t in jobs}))}) "
                        "and waiting for their workers"):
        infos = _in_parallel([lambda s=s, t=t: submit(s, t) for s, t in jobs])  # type: ignore[misc]
    out: dict[int, dict[str, tasks_pb2.TaskInfo]] = {}
    for (stage, task), info in zip(jobs, infos, strict=True):
        out.setdefault(stage, {})[task.name] = info
    return out


def _profile(timelines: list[tasks_pb2.TimelineResponse], out_dir: Path) -> dict[str, Any]:
    """The pipeline's bubble profile from what the agents recorded (freeride profile, docs/profile.md): its
    recording (profile.json, for `freeride profile --from`), its picture (profile.png), and per stage the
    measured idle share beside the schedule's theory."""
    rec = recording.Recording()
    for timeline in timelines:
        rec.add_timeline(timeline)
    recording.save(out_dir / "profile.json", rec)
    stages = analysis.profile(rec, [analysis.steps_for(ms) for ms in (1.0, 5.0, 20.0)])
    render.plot(stages, out_dir / "profile.png")
    return {"json": str(out_dir / "profile.json"), "png": str(out_dir / "profile.png"),
            "stages": render.as_dict(stages)["stages"]}


def run(plan: Plan, console: Console) -> dict[str, Any]:
    cfg = plan.pipeline
    started = time.monotonic()

    def log(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.1f} s[/]  {text}", highlight=False)

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    console.print(demo_report.intro(plan))
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="freeride-demo-")))
        agents = stack.enter_context(_agents(root, plan, console))
        log(f"{cfg.stages} agents up (sockets in {root})")
        clients = [stack.enter_context(a.client()) for a in agents]
        tasks = _submit(plan, clients, console)
        log(f"{sum(len(t) for t in tasks.values())} side-task workers ready, waiting for bubbles")
        collectors = [stack.enter_context(WindowCollector(c)) for c in clients]
        run_cfg = replace(cfg, socket_dir=str(root))
        pipeline = PipelineRun(run_cfg, root / "pipeline", watch=True)
        stack.callback(pipeline.stop, 2.0)  # ranks keep no state worth waiting for
        pipeline.start()
        log(f"pipeline started: {cfg.stages} training ranks")
        train_started = time.monotonic()
        losses = _follow(plan, pipeline, collectors, console, log)
        try:
            ranks = pipeline.wait(timeout_s=120)
        except RuntimeError as exc:
            raise UsageError(f"the training run failed: {exc}") from None
        train_s = time.monotonic() - train_started
        try:  # the ranks have exited: once their streams end, every window granted is accounted
            for c, col in zip(clients, collectors, strict=True):
                col.wait_for_all(c, 30.0)
        except TimeoutError as exc:
            raise UsageError(f"the agents did not account the last windows: {exc}") from None
        timelines = [c.timeline() for c in clients]
        stats = [c.stats() for c in clients]
        finals = {s: {name: clients[s].get(info.id) for name, info in ts.items()} for s, ts in tasks.items()}
        report = demo_report.build(plan, ranks, losses, tasks, finals, stats, collectors, train_s)
        png = plan.out_dir / "timeline.png"
        demo_report.draw(plan, ranks, timelines, png)
        report["timeline_png"] = str(png)
        report["profile"] = _profile(timelines, plan.out_dir)
    report["wall_s"] = round(time.monotonic() - started, 1)
    path = plan.out_dir / "report.json"
    report["report_json"] = str(path)
    path.write_text(json.dumps(report, indent=2))
    return report


def _follow(plan: Plan, pipeline: PipelineRun, collectors: list[WindowCollector], console: Console,
            log: Callable[[str], None]) -> list[float]:
    """Show the run's progress as the last rank reports each iteration; its losses."""
    cfg = plan.pipeline
    losses: list[float] = []
    phase = ""
    columns = (TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(f"starting the pipeline ({cfg.stages} ranks)", total=cfg.iterations, info="")
        for line in pipeline.iterations():
            it = int(line["iteration"])
            if line.get("loss") is not None:
                losses.append(float(line["loss"]))
            nxt = plan.phase(it + 1) if it + 1 < cfg.iterations else "done"
            steps = sum(s.steps for col in collectors for w in list(col.windows) for s in w.shares)
            if nxt != phase:
                phase = nxt
                loss = f", loss {losses[-1]:.3f}" if losses else ""
                log(f"iteration {it + 1}: {_PHASE_TEXT.get(nxt, nxt)}{loss}, {steps} side-task steps so far")
            progress.update(bar, completed=it + 1, description=f"training: {_PHASE_TEXT.get(nxt, nxt)}",
                            info=f"loss {losses[-1]:.2f}  side-task steps {steps}" if losses else "")
    return losses


_PHASE_TEXT = {"baseline": "baseline (side tasks idle)", "harvest": "harvest (side tasks in bubbles)",
               "warmup": "warm-up (agents learn bubbles)", "done": "done"}

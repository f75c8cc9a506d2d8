"""End to end: a bundled side task in a real agent's worker, killed with SIGKILL mid-way, finishes exactly once."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

from support.agents import BackgroundTrainer
from support.sidetasks import run, started, wait_for_checkpointed

from freeride.tooling.harness import wait_for_task
from freeride.v1 import tasks_pb2
from sidetasks.images import Thumbnails

S = tasks_pb2
ARGS = {"images": 500, "size": 24, "max_step_ms": 10}


def outputs(out_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out_dir.iterdir())}


def test_thumbnails_killed_mid_way_by_sigkill_resume_and_match_an_uninterrupted_run(agent, client, tmp_path: Path):
    reference = tmp_path / "reference"
    run(started(Thumbnails(**ARGS, out_dir=str(reference)), reference))
    out = tmp_path / "out"
    args = {**ARGS, "out_dir": out}
    task = client.submit(S.TaskSpec(ref="sidetasks.images:Thumbnails", args={k: str(v) for k, v in args.items()}))
    wait_for_task(client, task.id, [S.TASK_STATE_READY])
    # Bubbles far above a step (~5-20 ms): a step that a busy runner stretches past every bubble raises
    # the worker's step estimate (the max while it has few samples) above them, and it would wait forever.
    with BackgroundTrainer(agent, [150.0, 150.0]):
        running = wait_for_checkpointed(client, task.id, "images", 20)
        os.kill(running.pid, signal.SIGKILL)  # wherever it is: mid-step, mid-write or between steps
        done = wait_for_task(client, task.id, [S.TASK_STATE_DONE], timeout_s=60)
    assert running.progress["images"] < ARGS["images"]  # killed mid-way
    assert done.restarts == 1 and done.pid != running.pid
    assert done.progress["images"] == ARGS["images"]
    assert outputs(out) == outputs(reference)  # every image once, byte-identical, no temporary file left

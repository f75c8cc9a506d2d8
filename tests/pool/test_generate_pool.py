"""GeneratePool over two agents: exactly one completion per prompt after a killed worker and a killed agent.

Two agents on fake GPUs, each with a synthetic trainer, draw the prompts of one pool on a real
redis-server. Mid-run a worker of agent 0 is killed with SIGKILL, and agent 1 too, which then starts
again on its state dir. At the end the pool counts every prompt done once, and out_dir holds one
completion per prompt, each the same bytes as the prompt generated alone in this process.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.agents import FAST
from support.redis_server import RedisServer
from support.sidetasks import write_prompts

from freeride import PoolItem, TaskContext
from freeride.pool import parse_lines
from freeride.tooling.poolrun import FAKE_GPU, PoolRun, worker_up
from freeride.v1 import tasks_pb2
from sidetasks.generate import GeneratePool, main, output_path

S = tasks_pb2
PROMPTS = 240  # enough that a fast machine still has some pending after both kills and the restart
ARGS = {"max_new_tokens": "8"}


def test_two_agents_complete_every_prompt_exactly_once_through_worker_and_agent_deaths(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS)
    out = tmp_path / "out"
    url = redis_server.url("prompts")
    # Bubbles of 150 ms: an item (a prompt and 8 tokens, ~10 ms on a quiet core) fits them under load too.
    run = PoolRun(tmp_path, url, 2, bubble_ms=150.0, period_ms=200.0, agent_args=[*FAST, *FAKE_GPU, "--max-restarts",
                  "10"], task_ref="sidetasks.generate:GeneratePool", task_args={"out_dir": str(out), **ARGS})
    with run:
        assert run.pool.create(parse_lines(prompts.read_text().splitlines()), lease_s=2.0) == PROMPTS
        run.start()
        run.wait_pool(lambda s: s.done >= PROMPTS // 5, timeout_s=90)
        worker = run.wait_task(0, lambda t: t.pid != 0).pid
        assert run.pool.status(dead_shown=0).pending > 0, "the pool drained before the kills; add prompts"
        os.kill(worker, signal.SIGKILL)
        run.kill9(1)
        run.restart(1)
        # restarted: its new worker up, or already DONE (with the restarted agent it may drain the pool first)
        run.wait_task(0, lambda t: t.state == S.TASK_STATE_DONE
                      or (t.restarts >= 1 and t.pid != worker and worker_up(t)), timeout_s=30)
        infos = run.wait_finished(timeout_s=120)
        status = run.pool.status(dead_shown=10)
    assert {S.TaskState.Name(i.state) for i in infos.values()} == {"TASK_STATE_DONE"}
    assert (status.total, status.done, status.failed, status.in_flight, status.queued) == (PROMPTS, PROMPTS, 0, 0, 0)
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(output_path(out, f"q{i}").name for i in range(PROMPTS))  # one each, no temporary file

    reference = GeneratePool(url, out_dir=str(tmp_path / "reference"), **{k: int(v) for k, v in ARGS.items()})
    reference.context = TaskContext(task_id="1", checkpoint_path="")
    reference.setup()
    for line in prompts.read_text().splitlines():
        item = json.loads(line)
        reference.process(PoolItem(item.pop("id"), item))
    for name in files:  # a pure function of the prompt: the same bytes, whoever generated it and how often
        assert (out / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    assert main(["collect", str(out)]) == 0
    collected = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["id"] for r in collected) == sorted(f"q{i}" for i in range(PROMPTS))

"""sidetasks.generate in the bubbles of the anchor trace (1F1B, p=4, m=4, F=20, B=40, stage 1) against alone.

`PYTHONPATH=. python tools/bench_generate.py [--iterations 150] [--out FILE]`: one real agent, a synthetic
trainer replaying the trace, Generate (the byte decoder, greedy) in its bubbles; then, back to back in
the same run, the same task alone in this process (one long window) for as many units. Prints one JSON
object: tokens/s of bubble time and of busy time, alone; harvested share of the bubbles against `bench
harvest`'s ideal for a step of one unit; overruns.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from freeride import TaskContext
from freeride.core.stats import percentile
from freeride.tooling import trace as tr
from freeride.tooling.bench import paths
from freeride.tooling.bench.harvest import oracle_fill
from freeride.tooling.harness import AgentProcess, WindowCollector, replay, wait_for_task
from freeride.v1 import tasks_pb2
from sidetasks.generate import Generate

WORDS = ["def", "class", "import", "return", "while", "lambda", "yield", "with"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-step-ms", type=float, default=10.0)
    ns = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    prompts = root / "prompts.jsonl"
    rng = random.Random(0)
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": " ".join(rng.choice(WORDS) for _ in range(
        rng.randint(2, 8)))}) + "\n" for i in range(ns.prompts)))
    args = {"prompts": str(prompts), "max_new_tokens": str(ns.max_new_tokens), "max_batch": str(ns.max_batch),
            "max_step_ms": str(ns.max_step_ms)}
    stage_trace = tr.generate("1F1B", 4, 4, 20.0, 40.0, 0.02, ns.iterations, 0)[1]
    with AgentProcess(extra_args=list(paths.AGENT_ARGS)) as agent, agent.client() as client:
        info = client.submit(tasks_pb2.TaskSpec(ref="sidetasks.generate:Generate",
                                                args={**args, "out": str(root / "bubbles.jsonl")}))
        wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_READY])
        collector = WindowCollector(client)
        reporter = paths.connect("generate", agent.target, "shm", rank=1, stage=1)
        t0 = time.monotonic()
        bubbles = replay(reporter, stage_trace)
        wall_s = time.monotonic() - t0
        reporter.close()
        collector.wait_for(sum(seg.bubble for it in stage_trace[2:] for seg in it), 2.0)
        stats = client.stats()
        task = client.get(info.id)
        collector.close()
    g, c = stats.gpu, task.counters
    tokens_in_bubbles = task.progress["tokens"]
    # Alone: the same task, in this process, one long window, for as many tokens.
    alone = Generate(prompts=str(prompts), out=str(root / "alone.jsonl"), max_new_tokens=ns.max_new_tokens,
                     max_batch=ns.max_batch)
    alone.context = TaskContext(task_id="1", checkpoint_path=str(root / "alone.ckpt"))
    alone.setup()
    units: list[float] = []
    t0 = time.perf_counter()
    while alone.decoder.tokens_generated < tokens_in_bubbles and not alone.is_done():
        u0 = time.perf_counter()
        for done in alone.decoder.unit():
            alone.lines.append({"id": done.id})
        units.append(time.perf_counter() - u0)
    alone_s = time.perf_counter() - t0
    unit_s = percentile(units, 0.5)
    lengths = [(e - s) / 1e9 for _, s, e in bubbles]
    ideal = sum(oracle_fill(length, unit_s, 0.0, random.Random(0)) for length in lengths)
    out = {
        "machine": "see docs/benchmarks.md", "trace": "1F1B p=4 m=4 F=20 B=40 stage 1, jitter 2%",
        "iterations": ns.iterations, "wall_s": round(wall_s, 2),
        "bubble_s": round(g.bubble_s, 3), "harvested_s": round(g.harvested_s, 3),
        "efficiency": round(g.harvested_s / g.bubble_s, 4) if g.bubble_s else 0.0,
        "ideal_efficiency_one_unit_steps": round(ideal / sum(lengths), 4),
        "steps": c.steps, "overrun_steps": c.overrun_steps,
        "overrun_time_fraction": round(g.overrun_s / g.bubble_s, 5) if g.bubble_s else 0.0,
        "tokens_in_bubbles": int(tokens_in_bubbles), "prompts_done_in_bubbles": int(task.progress["prompts_done"]),
        "tokens_per_bubble_s": round(tokens_in_bubbles / g.bubble_s, 1) if g.bubble_s else 0.0,
        "tokens_per_harvested_s": round(tokens_in_bubbles / g.harvested_s, 1) if g.harvested_s else 0.0,
        "batch": task.progress["batch"],
        "alone_tokens": alone.decoder.tokens_generated, "alone_s": round(alone_s, 3),
        "alone_tokens_per_s": round(alone.decoder.tokens_generated / alone_s, 1),
        "unit_ms_p50_alone": round(unit_s * 1e3, 2), "unit_ms_p99_alone": round(percentile(units, 0.99) * 1e3, 2),
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

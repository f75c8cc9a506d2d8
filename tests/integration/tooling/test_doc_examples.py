"""Every Python example in README.md and docs/ runs, so a renamed function cannot leave the docs wrong.

Each ```python block is classified by what it shows, and run the way a reader would use it:
- a side task (a class deriving from IterativeTask or ImperativeTask) is written to a file, submitted
  to a real agent and driven by a synthetic trainer until it is DONE;
- a pool task (deriving from PoolTask) the same, drawing from a pool of 50 items on a real Redis,
  which must end with every item done;
- the reporter example finds the agent through FREERIDE_AGENT (no hard-coded socket path), runs against
  it, and the agent counts the edges it sent;
- the `connect()` example finds the agent through FREERIDE_AGENT and reports a bubble;
- the `freeride.Client` example finds the agent through FREERIDE_AGENT, and the task it submits is there;
- a model factory (a function returning an `nn.Module`, for sidetasks.generate and sidetasks.evaluate) is
  written to a file and named by `model=`: Generate completes six prompts with it in a real agent, then
  Evaluate scores a checkpoint of it, each until DONE;
- a trainer integration (it calls `instrument(...)` on objects a real job would have) has its
  imports run and `instrument` checked to be a function: the integrations' own tests run them.
A block that fits none of these fails the test: a new example needs a way to run here.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.agents import BackgroundTrainer
from support.paths import REPO
from support.redis_server import RedisServer, need_redis

from freeride.client import AgentClient
from freeride.pool import Pool, parse_pool_url, range_items
from freeride.tooling.harness import AgentProcess, wait_for_task, wait_for_trainers
from freeride.v1 import tasks_pb2

ROOT = REPO
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1)))
    return out


def task_classes(code: str, bases: tuple[str, ...] = ("IterativeTask", "ImperativeTask")) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []  # reported by test_every_example_can_be_run_here
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(getattr(b, "id", "") in bases for b in node.bases)]


def kind(code: str) -> str:
    if task_classes(code):
        return "task"
    if task_classes(code, ("PoolTask",)):
        return "pool"
    if "BubbleReporter(" in code:
        return "reporter"
    if "connect()" in code:
        return "connect"
    if "from freeride import Client" in code:
        return "client"
    if re.search(r"^handle = instrument\(", code, re.M):
        return "integration"
    if model_factories(code):
        return "model"
    return "unknown"


def model_factories(code: str) -> list[str]:
    """Top-level functions annotated to return an nn.Module."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.returns is not None
            and ast.unparse(node.returns) in ("nn.Module", "torch.nn.Module")]


EXAMPLES = examples()
IDS = [where for where, _ in EXAMPLES]


def test_the_docs_have_examples_of_each_kind():
    kinds = {kind(code) for _, code in EXAMPLES}
    assert {"task", "pool", "reporter", "connect", "integration", "client", "model"} <= kinds, kinds


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=IDS)
def test_every_example_can_be_run_here(where: str, code: str):
    ast.parse(code)  # a syntax error in the docs fails here first
    assert kind(code) != "unknown", f"{where}: no way to run this example; teach test_doc_examples.py one"


TASKS = [(w, c) for w, c in EXAMPLES if kind(c) == "task"]


@pytest.mark.parametrize(("where", "code"), TASKS, ids=[w for w, _ in TASKS])
def test_a_side_task_example_runs_to_done_in_a_real_agent(where: str, code: str, tmp_path: Path,
                                                        agent: AgentProcess, client: AgentClient):
    path = tmp_path / "example_task.py"
    path.write_text(code)
    (cls,) = task_classes(code)
    args = {"n": "300"} if "self.n" in code else {"items": "300"}
    info = client.submit(tasks_pb2.TaskSpec(ref=f"{path}:{cls}", args=args))
    with BackgroundTrainer(agent, [20.0, 20.0]):
        done = wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED], 60)
    assert done.state == tasks_pb2.TASK_STATE_DONE, f"{where}: {done.reason}"
    assert done.progress["done"] == 1.0 and done.checkpoint_steps > 0  # it stepped to the end and saved it


POOLS = [(w, c) for w, c in EXAMPLES if kind(c) == "pool"]


@pytest.mark.parametrize(("where", "code"), POOLS, ids=[w for w, _ in POOLS])
def test_a_pool_task_example_drains_its_pool_in_a_real_agent(where: str, code: str, tmp_path: Path,
                                                             agent: AgentProcess, client: AgentClient):
    need_redis()
    server = RedisServer(tmp_path / "redis").start()
    try:
        url = server.url("example")
        with Pool(parse_pool_url(url)) as pool:
            pool.create(range_items(50))
            path = tmp_path / "example_pool_task.py"
            path.write_text(code)
            (cls,) = task_classes(code, ("PoolTask",))
            args = {"pool": url, "out_dir": str(tmp_path / "out")}
            info = client.submit(tasks_pb2.TaskSpec(ref=f"{path}:{cls}", args=args))
            with BackgroundTrainer(agent, [20.0, 20.0]):
                done = wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED], 60)
            assert done.state == tasks_pb2.TASK_STATE_DONE, f"{where}: {done.reason}"
            status = pool.status()
            assert (status.done, status.failed, status.pending) == (50, 0, 0)
            assert len(list((tmp_path / "out").iterdir())) == 50
    finally:
        server.kill()


MODELS = [(w, c) for w, c in EXAMPLES if kind(c) == "model"]


@pytest.mark.parametrize(("where", "code"), MODELS, ids=[w for w, _ in MODELS])
def test_a_model_factory_example_generates_and_is_evaluated_in_a_real_agent(
    where: str, code: str, tmp_path: Path, agent: AgentProcess, client: AgentClient
):
    import torch

    path = tmp_path / "docs_model.py"
    path.write_text(code)
    (factory,) = model_factories(code)
    model = f"{path}:{factory}"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "def " * (i + 1)}) + "\n" for i in range(6)))
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    ns: dict[str, Any] = {}
    exec(compile(code, where, "exec"), ns)
    torch.save(ns[factory]().state_dict(), ckpts / "step-1.pt")
    (tmp_path / "heldout.txt").write_bytes(Path(json.__file__).read_bytes()[:3000])
    specs = [
        ("sidetasks.generate:Generate", {"model": model, "prompts": str(prompts), "out": str(tmp_path / "out.jsonl"),
                                         "max_new_tokens": "16", "temperature": "0.8", "seed": "1"}),
        ("sidetasks.evaluate:Evaluate", {"model": model, "checkpoints": str(ckpts), "count": "1", "seq_len": "64",
                                         "data": str(tmp_path / "heldout.txt"), "out": str(tmp_path / "evals.jsonl")}),
    ]
    for ref, args in specs:
        info = client.submit(tasks_pb2.TaskSpec(ref=ref, args=args))
        with BackgroundTrainer(agent, [60.0, 60.0]):
            done = wait_for_task(client, info.id, [tasks_pb2.TASK_STATE_DONE, tasks_pb2.TASK_STATE_FAILED], 90)
        assert done.state == tasks_pb2.TASK_STATE_DONE, f"{where}: {ref}: {done.reason}"
    completions = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(c["id"] for c in completions) == [f"p{i}" for i in range(6)]
    assert all(len(c["tokens"]) == 16 for c in completions)
    [evaluation] = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert evaluation["checkpoint"] == "step-1.pt" and evaluation["perplexity"] > 1


def _only(k: str) -> str:
    (code,) = [c for _, c in EXAMPLES if kind(c) == k]
    return code


def test_the_reporter_example_reports_its_bubbles_to_a_real_agent(agent: AgentProcess, client: AgentClient,
                                                                  monkeypatch: pytest.MonkeyPatch):
    code = _only("reporter")
    assert "/run/user/" not in code, "the example must not hard-code one user's socket path"
    monkeypatch.setenv("FREERIDE_AGENT", agent.target)  # what the example's agent_address() reads first
    ns: dict[str, Any] = {"rank": 0, "stage": 0, "slot": 3, "iterations": 50}
    # "The wait": here, for the reporter's stream to be up, so that no edge is dropped after the first.
    ns["wait"] = lambda: ns["reporter"].wait_connected(10)
    exec(compile(code, "README.md", "exec"), ns)
    reporter = ns["reporter"]
    reporter.close()
    stats = wait_for_trainers(client, 0)  # the stream ended after its last edge was read
    assert stats.gpu.events + reporter.dropped == 2 * 50
    assert stats.gpu.events >= 2 * 50 - 1  # only the first START can precede the connection


def test_the_connect_example_finds_the_agent_from_the_environment(agent: AgentProcess, client: AgentClient,
                                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FREERIDE_AGENT", agent.target)
    ns: dict[str, Any] = {"slot": 0}
    ns["wait"] = lambda: ns["reporter"].wait_connected(10)
    exec(compile(_only("connect"), "README.md", "exec"), ns)
    reporter = ns["reporter"]
    reporter.close()
    stats = wait_for_trainers(client, 0)
    assert stats.gpu.events + reporter.dropped == 2 and stats.gpu.events >= 1


def test_the_client_example_drives_the_agent_from_the_environment(agent: AgentProcess, client: AgentClient,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("FREERIDE_AGENT", agent.target)
    exec(compile(_only("client"), "docs/cli.md", "exec"), {})
    [task] = client.list()
    assert task.spec.name == "kmeans" and task.spec.priority == 10 and dict(task.spec.args) == {
        "k": "4", "points": "20000"}
    assert wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_CANCELLED], 60).state == tasks_pb2.TASK_STATE_CANCELLED
    out = capsys.readouterr().out
    assert out.startswith(f"submitted task {task.id}\n")
    assert f"\n{task.id} kmeans " in out, out  # the listing shows it: the example waited until it was READY
    assert out.splitlines()[-1].startswith("refused: ")  # the example catches InvalidStateError, a FreerideError


INTEGRATIONS = [(w, c) for w, c in EXAMPLES if kind(c) == "integration"]


@pytest.mark.parametrize(("where", "code"), INTEGRATIONS, ids=[w for w, _ in INTEGRATIONS])
def test_an_integration_example_imports_what_it_uses(where: str, code: str):
    tree = ast.parse(code)
    imports = ast.Module(body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[])
    assert imports.body, f"{where}: the example imports nothing"
    ns: dict[str, Any] = {}
    exec(compile(imports, where, "exec"), ns)
    assert callable(ns["instrument"]), f"{where}: instrument is not a function"

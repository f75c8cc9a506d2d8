"""deploy/monitoring on a real Prometheus: two real agents, each fed by a synthetic trainer and running a side
task, scraped by the shipped scrape configuration; every query of the dashboard and the rules must return data,
and alerts must fire when their condition is provoked (a trainer killed, an agent killed).

The shipped rules wait minutes (`for:`) before an alert fires; the copy Prometheus loads here waits 0 s, and
Prometheus scrapes and evaluates every second. Nothing else differs from the shipped files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.agents import FAST, free_port
from support.paths import REPO
from support.prometheus import Prometheus, finite, need_prometheus, until

from freeride.tooling.harness import AgentProcess, wait_for_task, wait_for_trainers
from freeride.v1 import tasks_pb2

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "freeride-rules.yml"
DASHBOARD = MONITORING / "freeride-dashboard.json"
# What Grafana puts in for the dashboard's variables; the value panels are checked with the defaults too.
VARIABLES = {"$__rate_interval": "5s", "$gpu_hour_price": "2.5", "$training_slowdown": "0.005"}
DEFAULTS = {"$__rate_interval": "5s", "$gpu_hour_price": "0", "$training_slowdown": "-1"}
# An alert's expression is one query compared with one number: the query alone must return data.
_COMPARED = re.compile(r"^(?P<query>.+?)\s*(?:==|!=|>=|<=|>|<)\s*-?[0-9.]+$", re.S)

# A synthetic trainer rank in a process of its own, so that it can be killed: one bubble of 8 ms and one of
# 30 ms per iteration, forever; "connected" on stdout once its stream is open.
TRAINER = """
import sys
from freeride.tooling.harness import replay
from freeride.tooling.trace import Segment
from freeride.trainer.reporter import BubbleReporter
reporter = BubbleReporter(sys.argv[1], rank=int(sys.argv[2]), stage=int(sys.argv[2]))
if not reporter.wait_connected(10):
    sys.exit("no agent")
print("connected", flush=True)
iteration = [Segment(0.002, False), Segment(0.008, True, 0), Segment(0.002, False), Segment(0.030, True, 1)]
while True:
    replay(reporter, [iteration])
"""


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows included."""
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for p in panels:
            yield from walk(p.get("panels", []))
            for t in p.get("targets", []):
                yield p["title"], t["expr"]

    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


def rule_queries() -> list[tuple[str, str]]:
    """(rule name, PromQL): a recording rule's expression, an alert's query without its threshold."""
    out = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            expr = " ".join(rule["expr"].split())
            if "alert" in rule:
                m = _COMPARED.match(expr)
                assert m, f"{rule['alert']}: {expr!r} is not QUERY <op> NUMBER"
                out.append((rule["alert"], m["query"]))
            else:
                out.append((rule["record"], expr))
    return out


def fill(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable the test does not know: {expr}"
    return expr


def test_the_dashboard_has_queries_and_every_alert_says_what_to_do() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 25
    assert all(expr.strip() for _, expr in queries)
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"FreerideAgentDown", "FreerideTrainerStreamLost",
                                            "FreerideTrainerEdgesDropped", "FreerideOverrunShareHigh",
                                            "FreerideTaskRestarting"}
    assert all(a["annotations"]["summary"] and a["annotations"]["description"] for a in alerts)


def test_the_shipped_rules_and_scrape_configuration_pass_promtool() -> None:
    need_prometheus()
    for args in (["check", "rules", str(RULES)], ["check", "config", str(MONITORING / "prometheus.yml")]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


class Trainer:
    """TRAINER as a child process."""

    def __init__(self, target: str, rank: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TRAINER, target, str(rank)], stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)

    def wait_connected(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child exits (EOF) if it cannot connect within 10 s
        assert line == "connected\n", f"trainer: {line!r}, exit {self.proc.poll()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def config_for(root: Path, targets: dict[str, str]) -> Path:
    """The shipped prometheus.yml, every second, with the rules (for: 0s) and the targets in `root`."""
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    (root / "freeride-rules.yml").write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 0s", RULES.read_text()))
    (root / "targets").mkdir()
    (root / "targets" / "agents.yml").write_text(
        yaml.safe_dump([{"targets": [t], "labels": {"node": node}} for node, t in targets.items()]))
    path = root / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[AgentProcess], list[Trainer], list[int]]]:
    """Two agents (a fake GPU, CPU mode), each with a capped sleeper task and a trainer rank of its own; their
    metrics ports."""
    agents: list[AgentProcess] = []
    ports: list[int] = []
    trainers: list[Trainer] = []
    try:
        for i, extra in enumerate((["--fake-gpu", "default"], [])):
            ports.append(free_port())
            agents.append(AgentProcess(state_dir=tmp_path / f"state{i}", gpu=i, extra_args=[
                *FAST, *extra, "--metrics-port", str(ports[-1])]).start())
        for i, agent in enumerate(agents):
            with agent.client() as client:
                task = client.submit(tasks_pb2.TaskSpec(ref="freeride.tooling.tasks:SleepTask", args={"step_ms": "1"},
                                                        name="sleeper", mem_limit_bytes=2 << 30))
                wait_for_task(client, task.id, [tasks_pb2.TASK_STATE_READY])
                trainers.append(Trainer(agent.target, rank=i))
                trainers[-1].wait_connected()
                wait_for_trainers(client, 1)
        yield agents, trainers, ports
    finally:
        for t in trainers:
            t.kill()
        for agent in agents:
            agent.stop()


def test_every_dashboard_and_rule_query_returns_data_and_alerts_fire(tmp_path: Path, fleet) -> None:
    need_prometheus()
    agents, trainers, ports = fleet
    targets = {f"node-{name}": f"127.0.0.1:{port}" for name, port in zip("ab", ports, strict=True)}
    root = tmp_path / "prometheus"
    root.mkdir()
    prom = Prometheus(root, config_for(root, targets), free_port()).start()
    try:
        queries = [*[(f"dashboard: {t}", fill(e, VARIABLES)) for t, e in dashboard_queries()],
                   *[(f"rule: {n}", e) for n, e in rule_queries()]]
        empty = dict(queries)

        def all_answered() -> bool | None:
            for name, expr in list(empty.items()):
                if finite(prom.query(expr)):
                    del empty[name]
            return True if not empty else None

        try:
            until("every query answered", all_answered, 45)
        except TimeoutError:
            pytest.fail("queries without data:\n" + "\n".join(f"{n}: {e}" for n, e in empty.items()))

        # What Prometheus scraped passes its own linter: a type and its labels agree (a gauge with a `quantile`
        # label failed it), names and help are as promtool expects.
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                scraped = reply.read().decode()
            done = subprocess.run(["promtool", "check", "metrics"], input=scraped, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr

        # Both nodes are seen, and the value figures are empty while nothing is declared: never assumed zero.
        nodes = {r["metric"]["node"] for r in prom.query("sum by (node) (freeride_bubble_seconds_total)")}
        assert nodes == set(targets)
        for title, expr in dashboard_queries():
            if "$gpu_hour_price" in expr or "$training_slowdown" in expr:
                assert prom.query(fill(expr, DEFAULTS)) == [], title

        # A trainer killed: its agent stays up, its stream is lost.
        trainers[1].kill()
        lost = until("FreerideTrainerStreamLost firing",
                     lambda: prom.firing("FreerideTrainerStreamLost") or None, 30)
        assert [(a["instance"], a["node"]) for a in lost] == [(targets["node-b"], "node-b")]
        # An agent killed: its scrapes fail.
        agents[1].kill9()
        down = until("FreerideAgentDown firing", lambda: prom.firing("FreerideAgentDown") or None, 30)
        assert [(a["instance"], a["node"]) for a in down] == [(targets["node-b"], "node-b")]
        # The lost stream's alert resolves with the agent's series: AgentDown alone speaks for that agent.
        until("FreerideTrainerStreamLost resolved", lambda: prom.firing("FreerideTrainerStreamLost") == [] or None, 30)
    finally:
        prom.stop()

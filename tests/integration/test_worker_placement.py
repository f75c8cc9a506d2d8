"""A real agent started with --worker-nice/--worker-cpus: its worker, every thread of it and whatever the task
starts run there. (SCHED_IDLE is checked in tests/unit/test_cpu_placement.py: on a loaded test machine an
idle-policy worker may wait long for a CPU.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import FAST

from freeride.tooling.harness import AgentProcess, wait_for_task
from freeride.v1 import tasks_pb2

TASK = Path(__file__).parents[1] / "tasks" / "placement.py"


def test_a_worker_its_threads_and_its_children_run_at_the_agents_nice_and_cpus(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    nice = max(7, os.getpriority(os.PRIO_PROCESS, 0))
    out = tmp_path / "placement.json"
    agent = AgentProcess(state_dir=tmp_path / "state",
                         extra_args=[*FAST, "--worker-nice", str(nice), "--worker-cpus", str(cpu)])
    with agent, agent.client() as c:
        info = c.submit(tasks_pb2.TaskSpec(ref=f"{TASK}:ReportsPlacement", args={"path": str(out)}))
        wait_for_task(c, info.id, [tasks_pb2.TASK_STATE_READY], timeout_s=60)
        placed = json.loads(out.read_text())
        assert f"side-task workers run at nice {nice}, CPUs {cpu}" in agent.log_tail(50)
    threads = placed["worker"] + placed["child"]
    assert len(placed["worker"]) >= 3  # main, gRPC's, the task's own: started before and after the worker began
    assert {(t["nice"], tuple(t["cpus"]), t["sched"]) for t in threads} == {(nice, (cpu,), os.SCHED_OTHER)}

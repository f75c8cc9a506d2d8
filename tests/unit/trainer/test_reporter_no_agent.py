"""With no agent there (not connected yet, or reconnecting), an edge would only be dropped: the reporter says the
agent is quiet, so a CPU stage samples its steps as it does for an agent with nothing to grant (issue 36 item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from freeride.trainer.edges import InlineClock
from freeride.trainer.reporter import BubbleReporter
from freeride.trainer.waits import FWD, WaitTracker

HOUR_NS = 3600 * 10**9


def test_with_no_agent_the_reporter_holds_and_a_cpu_stage_times_one_step_in_a_while(tmp_path: Path) -> None:
    reporter = BubbleReporter(f"unix:{tmp_path / 'none.sock'}", reconnect_min_s=60, reconnect_max_s=60)
    tracker = WaitTracker(reporter, InlineClock(), quiet_sample_ns=HOUR_NS)
    try:
        assert reporter.path == ""
        assert reporter.agent_quiet is True  # no agent listens
        assert reporter.hold() is True  # edges go in one write per flush (and are dropped there, counted)
        timed = []
        for _ in range(10):
            timed.append(tracker.timed())
            if timed[-1]:
                tracker.begin_step()
                tracker.wait(FWD, lambda: None)
                tracker.end_step()
            else:
                tracker.skip_step()
        assert timed == [True] + [False] * 9  # the first step, then one an hour
        assert tracker.untimed_steps == 9 and tracker.iteration == 9
    finally:
        tracker.close()
        reporter.close()
    assert reporter.sent == 0 and reporter.dropped == 2  # the timed step's wait (START, END): counted as dropped


def test_a_reporter_on_the_grpc_road_does_not_know_the_agents_word_and_never_says_quiet(tmp_path: Path) -> None:
    reporter = BubbleReporter(f"unix:{tmp_path / 'none.sock'}", reconnect_min_s=60, reconnect_max_s=60)
    try:
        reporter._live = True  # connected over gRPC (no ring attached): every step is timed, as before
        assert reporter.agent_quiet is False and reporter.hold() is False
    finally:
        reporter._live = False
        reporter.close()


def test_the_kinds_and_edges_the_trainer_side_writes_are_the_generated_enums() -> None:
    from freeride.core import ring
    from freeride.v1 import trainer_pb2

    assert (ring.EDGE_START, ring.EDGE_END) == (trainer_pb2.BUBBLE_EDGE_START, trainer_pb2.BUBBLE_EDGE_END)
    assert frozenset(trainer_pb2.BubbleKind.values()) == ring.KINDS
    assert (ring.KIND_FILL, ring.KIND_WARMUP, ring.KIND_DRAIN, ring.KIND_COOLDOWN, ring.KIND_BETWEEN_STEPS) == (
        trainer_pb2.BUBBLE_KIND_FILL, trainer_pb2.BUBBLE_KIND_WARMUP, trainer_pb2.BUBBLE_KIND_DRAIN,
        trainer_pb2.BUBBLE_KIND_COOLDOWN, trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS)


def test_instrumenting_loads_neither_grpc_nor_protobuf_on_the_training_thread(tmp_path: Path) -> None:
    """A job's first step does not wait ~0.1 s for them: the reporter's own thread loads them once there is an agent's
    socket to connect to (tests/integration/trainers/test_reporter.py: an agent that starts later is reached)."""
    code = (
        "import sys, threading\n"
        "import freeride.trainer.deepspeed, freeride.trainer.torch_pipelining, freeride.trainer.megatron\n"
        "from freeride.trainer import connect\n"
        "loaded = [m for m in ('grpc', 'google.protobuf') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "r = connect(f'unix:{sys.argv[1]}')\n"
        "assert r.wait_path('', 1)\n"
        "r.close()\n"
        "r._thread.join(60)\n"
        "assert 'grpc' not in sys.modules  # no socket: no agent to talk to, nothing loaded for it\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "none.sock")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]

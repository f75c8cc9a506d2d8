"""The worker's end of a task's life, in-process: stop and checkpoint, restore, what it reports and in whose words.

A Worker is built without an agent (its gRPC channel is never used): the tests call its checkpoint and
restore paths directly and read the messages it queued for the agent.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_worker_gate import Harness

from freeride import TaskStop
from freeride.v1 import worker_pb2 as pb


def test_a_window_granted_but_not_yet_seen_when_a_stop_arrives_is_given_back_before_the_checkpoint(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.writer.grant(1, time.monotonic_ns() + 10**9)  # the grant and the cancel wake the idle worker together
    h.control(pb.CONTROL_ACTION_CANCEL)
    with pytest.raises(TaskStop):
        h.gate.acquire()
    assert h.done() == [(1, pb.WINDOW_END_REASON_STOPPING)]  # else the agent's hang timer kills the checkpoint


# -- bug 5: the worker's own peak memory, not its parent's ------------------------------------------
_REPORT_PEAK = """
from freeride.sdk._estimate import StepEstimator
from freeride.sdk.worker import _Gate, _Shared
sent = []
gate = _Gate(_Shared(), sent.append, StepEstimator(), lambda force: None)
gate._flush_steps()
print(sent[0].steps.peak_memory_bytes)
"""
_BIG_PARENT = """
import subprocess, sys
held = b"x" * (400 << 20)  # written: 400 MiB resident, the parent's high-water mark
del held
print(subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, check=True).stdout)
"""


def test_a_worker_started_by_a_parent_with_a_high_peak_reports_its_own_small_peak() -> None:
    out = subprocess.run([sys.executable, "-c", _BIG_PARENT, _REPORT_PEAK], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    peak = int(out.strip())
    assert 10 << 20 < peak < 200 << 20  # a Python with grpc loaded; ru_maxrss would say the parent's 400+ MiB

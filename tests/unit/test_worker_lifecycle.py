"""The worker's end of a task's life, in-process: stop and checkpoint, restore, what it reports and in whose words.

A Worker is built without an agent (its gRPC channel is never used): the tests call its checkpoint and
restore paths directly and read the messages it queued for the agent.
"""

from __future__ import annotations

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

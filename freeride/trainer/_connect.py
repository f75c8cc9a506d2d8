"""Find the agent of this rank's GPU and open a reporter to it."""

from __future__ import annotations

import logging
import os

from freeride.core.auth import TokenError, token_from
from freeride.core.paths import agent_target
from freeride.trainer.reporter import BubbleReporter, Pipeline

log = logging.getLogger(__name__)


def local_gpu_index() -> int:
    """The GPU this process trains on: the current CUDA device, else LOCAL_RANK, else 0."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except ImportError:
        pass
    raw = os.environ.get("LOCAL_RANK", "0")
    return int(raw) if raw.isdigit() else 0


def agent_address(address: str | None = None, gpu: int | None = None) -> str:
    """Where this rank's agent listens.

    An explicit address wins; then FREERIDE_AGENT; then the default socket of this rank's GPU
    (`$FREERIDE_SOCKET_DIR`, `$XDG_RUNTIME_DIR/freeride` or `/tmp/freeride-UID`, file
    `agent-gpuN.sock`). With data parallelism and many nodes every rank still talks to the agent
    of its own GPU on its own host, so no cluster-wide address is needed.
    """
    address = address or os.environ.get("FREERIDE_AGENT") or None
    return agent_target(address, local_gpu_index() if gpu is None else gpu)


def connect(
    address: str | None = None, *, rank: int | None = None, stage: int = 0, gpu: int | None = None,
    token_file: str | None = None, path: str | None = None, pipeline: Pipeline | None = None,
) -> BubbleReporter:
    """A reporter for this rank. Never fails: with no agent, edges are dropped (one warning).

    An agent reached over TCP wants its token: `token_file`, else $FREERIDE_TOKEN_FILE. `path`
    ("auto" or "grpc", else $FREERIDE_BUBBLE_PATH, else "auto"): "auto" takes the agent's
    shared-memory ring when the agent is on this host, "grpc" keeps the edges on the gRPC stream.
    `pipeline`: the schedule, p and m this rank declares (`freeride profile` sets its theory beside them).
    """
    if rank is None:
        raw = os.environ.get("RANK", "0")
        rank = int(raw) if raw.isdigit() else 0
    target = agent_address(address, gpu)
    log.debug("rank %d reports bubbles to %s", rank, target)
    try:
        token = token_from(token_file)
    except TokenError as exc:
        log.warning("%s; reporting without a token (an agent on TCP will refuse it)", exc)
        token = None
    return BubbleReporter(target, rank=rank, stage=stage, token=token, path=path, pipeline=pipeline)

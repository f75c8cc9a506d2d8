"""The committed gRPC code in freeride/v1 is what the .proto files generate (run tools/gen_proto.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    from gen_proto import generate

    fresh = {p.name: p.read_bytes() for p in generate(tmp_path)}
    committed = {p.name: p.read_bytes() for p in (ROOT / "freeride" / "v1").iterdir() if p.suffix in {".py", ".pyi"}}
    committed.pop("__init__.py")
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stale generated code {stale}: run `python tools/gen_proto.py` and commit the result"


def test_the_api_is_importable_and_exposes_health() -> None:
    from grpc_health.v1 import health_pb2  # noqa: F401  (the standard health service ships as a dependency)

    from freeride.v1 import tasks_pb2_grpc, trainer_pb2_grpc, worker_pb2_grpc

    assert tasks_pb2_grpc.TaskServiceStub and trainer_pb2_grpc.BubbleServiceStub and worker_pb2_grpc.WorkerServiceStub

"""Regenerate freeride/v1 from proto/freeride/v1 (run after editing a .proto).

The generated package is committed so that a plain `pip install` needs no code generator;
tests/test_proto_stubs.py fails when the committed files are stale.

The grpcio-tools release that writes the code sets the oldest protobuf and grpcio that can import it:

- each *_pb2.py calls protobuf's runtime_version.ValidateProtobufRuntimeVersion with the version of
  the protoc inside grpcio-tools (its "gencode"), and every protobuf runtime raises VersionError when
  it is older than that gencode (protobuf <5.26 has no runtime_version at all). A newer runtime
  accepts it: 5.x at or past it, 6.32+ and 7.x silently; 6.30.x and 6.31.x with a warning on every
  import ("gencode ... exactly one major version older"), so pyproject.toml excludes those two.
- each *_pb2_grpc.py raises RuntimeError at import when grpcio is older than GRPC_GENERATED_VERSION,
  the grpcio-tools version itself.

So the committed code comes from an old grpcio-tools, GRPCIO_TOOLS below: 1.66.2 writes gencode
5.27.2, which imports on protobuf >=5.27.2 (5.x, 6.x and 7.x) with grpcio >=1.66.2, the bounds in
pyproject.toml. grpcio-tools 1.66.2 itself needs protobuf <6, so it is pinned in the dev extra
(a dev venv gets protobuf 5.29.x), or run it from a throwaway venv:

    python3 -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools==1.66.2
    /tmp/gen/bin/python tools/gen_proto.py

Raising GRPCIO_TOOLS raises those lower bounds (gencode of 1.71.2: 5.29.0, 1.72.2: 6.30.0, 1.80.1:
6.31.1, 1.81.1: 6.33.5, 1.85.1: 7.35.1): change pyproject.toml's grpcio, grpcio-health-checking,
protobuf and grpcio-tools lines with it.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GRPCIO_TOOLS = "1.66.2"  # the release that generates the committed freeride/v1 (see above)


def generate(out_dir: Path) -> list[Path]:
    """Generate the stubs for every .proto into out_dir/freeride/v1 and return the files."""
    have = version("grpcio-tools")
    if have != GRPCIO_TOOLS:
        raise RuntimeError(
            f"grpcio-tools {have} is installed, but freeride/v1 is generated with grpcio-tools=={GRPCIO_TOOLS} "
            f"(tools/gen_proto.py says why): pip install grpcio-tools=={GRPCIO_TOOLS}"
        )
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "freeride" / "v1").glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    gen = out_dir / "freeride" / "v1"
    return sorted(p for p in gen.iterdir() if p.suffix in {".py", ".pyi"})


if __name__ == "__main__":
    generate(ROOT)
    init = ROOT / "freeride" / "v1" / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated gRPC code for the freeride.v1 API (see proto/). Do not edit."""\n')
    sys.exit(0)

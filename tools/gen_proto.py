"""Regenerate freeride/v1 from proto/freeride/v1 (run after editing a .proto).

The generated package is committed so that a plain `pip install` needs no code generator;
tests/test_proto_stubs.py fails when the committed files are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def generate(out_dir: Path) -> list[Path]:
    """Generate the stubs for every .proto into out_dir/freeride/v1 and return the files."""
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

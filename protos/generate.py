"""Regenerate embed_pb2.py, embed_pb2.pyi and embed_pb2_grpc.py from embed.proto.

Usage: python -m protos.generate [OUT_DIR]   (default: in place). Needs the pinned grpcio-tools.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev-only dependency

    (out_dir / "protos").mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(ROOT / "protos" / "embed.proto"),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)

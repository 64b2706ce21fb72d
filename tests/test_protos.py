"""The committed gRPC stubs are exactly what the pinned grpcio-tools generates from protos/embed.proto."""

from pathlib import Path

import pytest

from protos.generate import ROOT, generate

pytest.importorskip("grpc_tools")


def test_committed_stubs_match_proto(tmp_path: Path) -> None:
    """RELIABILITY 25: the committed stubs are what the pinned grpcio-tools generates from protos/."""
    generate(tmp_path)
    for name in ("embed_pb2.py", "embed_pb2.pyi", "embed_pb2_grpc.py"):
        fresh = (tmp_path / "protos" / name).read_text()
        committed = (ROOT / "protos" / name).read_text()
        assert fresh == committed, f"protos/{name} drifted from embed.proto: run `python -m protos.generate`"


def test_stubs_import_and_round_trip() -> None:
    from protos import embed_pb2

    req = embed_pb2.EmbedRequest(token_ids=b"\x01\x00\x00\x00", seq_lens=b"\x01\x00\x00\x00", dimensions=8)
    back = embed_pb2.EmbedRequest.FromString(req.SerializeToString())
    assert back.dimensions == 8 and not back.HasField("normalize")

"""Tulip serving BGE-M3 and SPLADE with the real ROSE engine on a CPU: a request names the output it wants
(EmbedRequest.output) and gets those columns of the native rows with that output's normalization, batched
with other requests' outputs; an unknown output is INVALID_ARGUMENT naming the model's."""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from tulip_testkit import ServerThread, decode_response, encode_request, make_config

from protos import embed_pb2

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
sys.path.insert(0, str(Path(__file__).parent.parent / "rose"))  # the tiny model builders

from rose_retrieval_models import TEXTS, build_bge_m3, build_splade  # noqa: E402

from rose.retrieval_rows import token_vector_spans  # noqa: E402


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from rose.engine import Engine

    root = tmp_path_factory.mktemp("tulip-retrieval")
    with Engine.from_pretrained(build_bge_m3(root), device="cpu") as m3, \
            Engine.from_pretrained(build_splade(root), device="cpu") as splade:
        yield {"bge-m3": m3, "splade": splade}


def test_each_request_gets_its_output(engines) -> None:
    engine = engines["bge-m3"]
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
    spans = token_vector_spans([len(s) for s in ids])
    dense, vectors = engine.embed(ids), engine.embed(ids, spans=spans, output="token-vectors")
    with ServerThread(make_config(max_batch_tokens=64, max_batch_seqs=4), engine=engine) as s:
        info = s.stub.Info(embed_pb2.InfoRequest(), timeout=10)
        assert (list(info.tasks), info.dimensions) == (["embed", "multi-vector", "sparse"], 64)
        plain = encode_request(ids)
        multi = encode_request(ids, spans=spans)
        multi.output = "token-vectors"
        futures = [s.stub.Embed.future(r, timeout=60) for r in (plain, multi, plain)]
        got = [decode_response(f.result()) for f in futures]
        np.testing.assert_allclose(got[0], dense, atol=1e-6)
        np.testing.assert_allclose(got[1], vectors, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(got[1], axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(got[2], dense, atol=1e-6)
        bad = encode_request(ids[:1])
        bad.output = "colbert"
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "token-vectors" in err.value.details()


def test_splade_rows_are_vocab_wide_and_not_normalized(engines) -> None:
    engine = engines["splade"]
    ids = [e.ids for e in engine.tokenizer.encode_batch(TEXTS)]
    rows = engine.embed(ids)  # before the server, which closes the engine when it stops
    with ServerThread(make_config(), engine=engine) as s:
        got = decode_response(s.stub.Embed(encode_request(ids), timeout=60))
    assert got.shape == (len(TEXTS), 256) and (got > 0).sum() < got.size
    np.testing.assert_allclose(got, rows, atol=1e-6)

"""Tulip serving a cross-encoder with the real ROSE engine on a CPU: pairs with their token types over gRPC,
batched with other requests' pairs, one score per pair equal to the pair alone; Info says rerank."""

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

from rose_cross_models import PAIRS, build_bert_ce  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_bert_ce(tmp_path_factory.mktemp("tulip-ce"))


@pytest.fixture
def engine(folder):  # one per test: a server closes its engine when it stops
    from rose.engine import Engine

    with Engine.from_pretrained(folder, device="cpu") as e:
        yield e


def test_pairs_with_token_types_score_as_alone(engine) -> None:
    encoded = engine.tokenizer.encode_pairs(PAIRS)
    ids, types = [p.ids for p in encoded], [p.type_ids for p in encoded]
    solo = np.array([engine.embed([i], token_types=[t])[0, 0] for i, t in zip(ids, types)])
    config = make_config(max_batch_tokens=64, max_batch_seqs=4)  # pairs of several requests share batches
    with ServerThread(config, engine=engine) as s:
        info = s.stub.Info(embed_pb2.InfoRequest(), timeout=10)
        assert (list(info.tasks), info.dimensions, info.pooling, info.normalized) == (["rerank"], 1, "cls", False)
        picks = [[0, 1], [2], [3, 4, 5], [5, 0], [1, 2, 3]]
        requests = []
        for pick in picks:
            req = encode_request([ids[i] for i in pick])
            req.token_types = bytes(t for i in pick for t in types[i])
            requests.append(req)
        futures = [s.stub.Embed.future(r, timeout=60) for r in requests]
        for pick, fut in zip(picks, futures):
            got = decode_response(fut.result())
            assert got.shape == (len(pick), 1)
            np.testing.assert_allclose(got[:, 0], solo[pick], atol=1e-6)
        bad = encode_request([ids[0]])
        bad.token_types = bytes([2] * len(ids[0]))
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "below 2" in err.value.details()


def test_the_logit_output_is_the_raw_score_beside_the_default_score(engine) -> None:
    """A sigmoid reranker's `logit` output (Ivy's raw scores) next to the default score, batched together; its
    width is one column either way, and a name the model lacks is refused by name."""
    encoded = engine.tokenizer.encode_pairs(PAIRS)
    ids, types = [p.ids for p in encoded], [p.type_ids for p in encoded]
    with ServerThread(make_config(max_batch_tokens=256, max_batch_seqs=8), engine=engine) as s:
        assert list(s.stub.Info(embed_pb2.InfoRequest(), timeout=10).outputs) == ["score", "logit"]  # Ivy routes by it
        futures = []
        for output in ("", "logit", "score"):
            req = encode_request(ids)
            req.token_types = bytes(t for row in types for t in row)
            req.output = output
            futures.append(s.stub.Embed.future(req, timeout=60))
        score, logit, named = (decode_response(f.result()) for f in futures)
        assert score.shape == logit.shape == (len(PAIRS), 1)
        # the two requests' pairs land in batches of different sizes (here 108 tokens and 129 + 87): a CPU's matmul
        # may round a row 1 ulp apart across batch sizes, as for a pair alone (the test above)
        np.testing.assert_allclose(score, named, rtol=0, atol=1e-6)
        np.testing.assert_allclose(1 / (1 + np.exp(-logit)), score, atol=1e-6)
        assert np.abs(logit - score).min() > 1e-2
        bad = encode_request(ids[:1])
        bad.output = "vocab-weights"
        with pytest.raises(grpc.RpcError) as err:
            s.stub.Embed(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "['score', 'logit']" in err.value.details()

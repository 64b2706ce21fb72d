"""The peers' request fields that changed an answer while Ivy ignored them, each now served or refused by name.

- /v1/embeddings (and Infinity's /embeddings) ignored vLLM's `add_special_tokens`, `embed_dtype` and
  `endianness`, which vLLM takes there too: a client asking for no special tokens got them, one asking for
  big-endian float16 decoded little-endian float32 bytes. embed_dtype (float32, float16, bfloat16, fp8_e4m3,
  fp8_e5m2) and endianness are served on base64 as vLLM writes them (/pooling refused them too); what is not served
  (add_special_tokens false) is refused by name, and chat `messages` is named, not answered "input: Field
  required".
- A reranker's raw scores (vLLM's `use_activation: false`, Infinity's and TEI's `raw_scores: true`) were answered
  with the activation applied; they are the logits before it now (Tulip's `logit` output, from the same forward),
  and the same answer where the scores are already raw (cosine; a reranker whose activation is Identity).
- /score took only vLLM's oldest names for its sides (text_1, text_2): queries with documents or items, and
  data_1 with data_2, are read as them and named as sent in errors.
- Rerank results left out `document` unless asked: vLLM always returns it (its RerankResult requires it) and
  Jina by default. Omitted, it is returned at /rerank and /v1/rerank; /v2/rerank (Cohere v2) keeps it out.
"""

from __future__ import annotations

import base64
import warnings

import numpy as np
import pytest
from cross_folders import bert_reranker
from fake_tulip import FakeTulip
from ivy_testkit import gateway, model_copy
from test_ivy_score_fields import scores_of
from test_ivy_scoring import DOCS, QUERY

IDENTITY = {"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}


def _error(response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["param"], error["message"]


@pytest.mark.parametrize("route", ["/v1/embeddings", "/embeddings"])
@pytest.mark.parametrize("extra, param, says", [
    ({"add_special_tokens": False}, "add_special_tokens", "special tokens"),
    ({"embed_dtype": "fp4", "encoding_format": "base64"}, "embed_dtype", "fp8_e5m2"),
    ({"embed_dtype": "float16", "encoding_format": "base64_binary"}, "embed_dtype", "base64_binary has its own"),
    ({"endianness": "middle", "encoding_format": "base64"}, "endianness", "'native', 'little' or 'big'"),
    ({"mm_processor_kwargs": {"size": 224}}, "mm_processor_kwargs", "multimodal"),
    ({"output_dtype": "binary"}, "output_dtype", "quantized types are not served"),  # Voyage's
    ({"output_dtype": "int8"}, "output_dtype", "base64_int8"),
    ({"embedding_type": "ubinary"}, "embedding_type", "quantized types are not served"),  # Jina's
    ({"task": "text-matching"}, "task", "retrieval.query or retrieval.passage"),
    ({"return_multivector": True}, "return_multivector", "/embed_multi_vector"),
    ({"task_type": "CLASSIFICATION"}, "task_type", "RETRIEVAL_QUERY"),  # Gemini's
    ({"taskType": "CLUSTERING"}, "taskType", "RETRIEVAL_DOCUMENT"),
    ({"modality": "image"}, "modality", "reads text"),  # Infinity's
    ({"long_text_mode": "mean"}, "long_text_mode", "not split and averaged"),  # Nomic's
    ({"prompt": "Represent this sentence: "}, "prompt", "free-text prompt"),  # Mixedbread's
])
def test_vllm_fields_embeddings_cannot_honour_are_refused_by_name(client, fake, route, extra, param, says) -> None:
    code, named, message = _error(client.post(route, json={"input": "hello world", **extra}))
    assert (code, named) == (422, param) and says in message, message
    assert fake.calls == []


@pytest.mark.parametrize("route", ["/v1/embeddings", "/embeddings"])
def test_chat_messages_are_named(client, fake, route) -> None:
    code, named, message = _error(client.post(route, json={"messages": [{"role": "user", "content": "hi"}]}))
    assert (code, named) == (422, "messages") and "chat input is not served" in message
    assert fake.calls == []


@pytest.mark.parametrize("route, field", [("/v1/embeddings", "embedding"), ("/embeddings", "embedding"),
                                          ("/pooling", "data")])
@pytest.mark.parametrize("embed_dtype", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("endianness", ["little", "big", "native"])
def test_base64_bytes_are_vllms_embed_dtype_and_endianness(client, route, field, embed_dtype, endianness) -> None:
    """vLLM's tensor2binary: the float32 row cast by torch to embed_dtype, bytes swapped unless in the order
    asked (native: this server's); float ignores both, as vLLM's does."""
    import sys

    import torch

    texts = ["hello world", "the cat sat on the mat"]
    rows = client.post(route, json={"input": texts, "encoding_format": "float"}).json()["data"]
    body = {"input": texts, "encoding_format": "base64", "embed_dtype": embed_dtype, "endianness": endianness}
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    for row, got in zip(rows, r.json()["data"]):
        dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(embed_dtype)
        cast = torch.tensor(row[field], dtype=torch.float32).to(dtype or getattr(torch, embed_dtype))
        view = torch.uint8 if dtype else torch.int32 if embed_dtype == "float32" else torch.int16
        wanted = cast.view(view).numpy()
        if endianness not in ("native", sys.byteorder):
            wanted = wanted.byteswap()
        assert base64.b64decode(got[field]) == wanted.tobytes()
    floats = client.post(route, json={**body, "encoding_format": "float"}).json()["data"]
    assert [x[field] for x in floats] == [x[field] for x in rows]


def test_fp8_bytes_are_torchs_cast_at_every_edge() -> None:
    """Every fp8 value, the midpoints between neighbours (ties to even) and the floats either side of them,
    subnormals, signed zeros, the values past the largest finite one and the non-finite ones (Tulip checks a
    large batch's first and last rows only), against torch's cast, byte for byte."""
    import torch

    from ivy.encode import row_value

    rng = np.random.default_rng(3)
    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        exact = np.sort(codes[torch.isfinite(codes)].numpy().astype(np.float64))
        mids = ((exact[1:] + exact[:-1]) / 2).astype(np.float32)
        edges = np.concatenate([exact.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                                np.nextafter(mids, np.float32(-np.inf)),
                                [0.0, -0.0, 1e-30, -1e-30, 1e30, -1e30, np.inf, np.nan]])
        scaled = np.concatenate([rng.standard_normal(20_000) * 10.0 ** k for k in range(-6, 7)])
        row = np.concatenate([edges, -edges, scaled]).astype(np.float32)
        wanted = torch.from_numpy(row).to(dtype).view(torch.uint8).numpy()
        for order in ("<", ">"):  # one byte a value: the order changes nothing
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no invalid-value cast on the way
                got = np.frombuffer(base64.b64decode(row_value(row, "base64", order + name[4:])), dtype=np.uint8)
            bad = np.flatnonzero(got != wanted)
            assert bad.size == 0, (name, row[bad[:5]], got[bad[:5]], wanted[bad[:5]])


@pytest.mark.parametrize("extra, ours", [
    ({"task": "retrieval.query"}, {"input_type": "query"}),  # Jina's
    ({"task": "retrieval.passage"}, {"input_type": "document"}),
    ({"task_type": "search_query"}, {"input_type": "query"}),  # Nomic's
    ({"task_type": "RETRIEVAL_DOCUMENT"}, {"input_type": "document"}),  # Gemini's
    ({"taskType": "RETRIEVAL_QUERY"}, {"input_type": "query"}),
    ({"dimensionality": 64}, {"dimensions": 64}),  # Nomic's
    ({"output_dimensionality": 32}, {"dimensions": 32}),  # Gemini's
    ({"outputDimensionality": 48}, {"dimensions": 48}),
    ({"embedding_type": "base64"}, {"encoding_format": "base64"}),  # Jina's base64 is float32's
    ({"long_text_mode": "truncate", "input": "word " * 600}, {"truncate": True, "input": "word " * 600}),
    ({"truncation_side": None}, {}),  # a null a proxy wrote out
    ({"modality": "text", "late_chunking": False, "return_multivector": False}, {}),
])
def test_other_apis_fields_are_read_as_ivys(tmp_path, extra, ours) -> None:
    """The query / document prompt each task selector names, the dimension names, Jina's base64: the same answer as
    Ivy's own field; on a model whose prompts differ, so that a task that went unread would show."""
    folder = model_copy(tmp_path, "prompted", st_config={"prompts": {"query": "query: ", "document": "passage: "}})
    fake = FakeTulip(model_dir=folder)
    with fake, gateway(fake, model=str(fake.model_dir)) as client:
        base = {"input": "hello there"}
        theirs = client.post("/v1/embeddings", json={**base, **extra})
        mine = client.post("/v1/embeddings", json={**base, **ours})
        assert theirs.status_code == mine.status_code == 200, theirs.text
        assert theirs.json()["data"] == mine.json()["data"] and fake.calls[-1].token_ids == fake.calls[-2].token_ids
        if "input_type" in ours:  # the prompt reached the tokens: not what a plain request sends
            client.post("/v1/embeddings", json=base)
            assert fake.calls[-1].token_ids != fake.calls[-2].token_ids


def test_vllm_fields_with_what_is_served_change_nothing(client) -> None:
    plain = client.post("/v1/embeddings", json={"input": "hello world", "encoding_format": "base64"}).json()
    for extra in ({"add_special_tokens": True}, {"embed_dtype": "float32"}, {"endianness": "little"},
                  {"output_dtype": "float"}, {"embedding_type": "float"},
                  {"endianness": "native"}, {"embed_dtype": None, "endianness": None, "messages": None}):
        r = client.post("/v1/embeddings", json={"input": "hello world", "encoding_format": "base64", **extra})
        assert r.status_code == 200 and r.json()["data"] == plain["data"], (extra, r.text)


# ---- a reranker's raw scores ----

def _raw_asks(query: str, docs: list[str]) -> list[tuple[str, dict, str]]:
    rerank = {"query": query, "documents": docs}
    return [("/v1/score", {"text_1": query, "text_2": docs, "use_activation": False}, "use_activation"),
            ("/score", {"text_1": query, "text_2": docs, "use_activation": False}, "use_activation"),
            ("/v1/rerank", {**rerank, "use_activation": False}, "use_activation"),
            ("/rerank", {**rerank, "use_activation": False}, "use_activation"),
            ("/rerank", {**rerank, "raw_scores": True}, "raw_scores"),
            ("/v2/rerank", {**rerank, "raw_scores": True}, "raw_scores"),
            ("/rerank", {"query": query, "texts": docs, "raw_scores": True}, "raw_scores"),
            ("/rerank", {"query": query, "texts": docs, "use_activation": False}, "use_activation")]


def test_a_sigmoid_rerankers_raw_scores_are_its_logits(tmp_path) -> None:
    """Asked for raw scores, Ivy asks Tulip for the reranker's `logit` output: the scores' inverse sigmoid."""
    fake = FakeTulip(model_dir=bert_reranker(tmp_path))
    with fake, gateway(fake, model=str(fake.model_dir)) as client:
        for route, body, param in _raw_asks(QUERY, DOCS):
            plain = {k: v for k, v in body.items() if k != param}
            r, activated = client.post(route, json=body), client.post(route, json=plain)
            assert r.status_code == activated.status_code == 200, (route, r.text)
            raw, scores = np.array(scores_of(route, r.json())), np.array(scores_of(route, activated.json()))
            np.testing.assert_allclose(1 / (1 + np.exp(-raw)), scores, atol=1e-6)
            assert np.abs(raw - scores).min() > 1e-2, route  # the logits, not the scores again
            assert [c.output for c in fake.calls[-2:]] == ["logit", ""], route
        activated = {**_raw_asks(QUERY, DOCS)[0][1], "use_activation": True}  # true is the activated score
        assert client.post("/v1/score", json=activated).status_code == 200 and fake.calls[-1].output == ""


def test_raw_scores_are_honoured_where_the_scores_are_raw(tmp_path, client) -> None:
    """An Identity reranker's scores and cosine scores have no activation to take off: the same answer."""
    fake = FakeTulip(model_dir=bert_reranker(tmp_path, **IDENTITY))
    with fake, gateway(fake, model=str(fake.model_dir)) as identity:
        for c in (identity, client):
            for route, body, param in _raw_asks(QUERY, DOCS):
                plain = {k: v for k, v in body.items() if k != param}
                r, expected = c.post(route, json=body), c.post(route, json=plain)
                assert r.status_code == 200, (route, r.text)
                assert scores_of(route, r.json()) == scores_of(route, expected.json()), route


# ---- /score's sides by vLLM's newer names ----

@pytest.mark.parametrize("first, second", [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")])
def test_score_reads_vllms_newer_names(client, first, second) -> None:
    expected = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS}).json()
    for route in ("/v1/score", "/score"):
        r = client.post(route, json={first: QUERY, second: DOCS})
        assert r.status_code == 200, r.text
        assert r.json()["data"] == expected["data"] and r.json()["usage"] == expected["usage"]
        pairwise = client.post(route, json={first: [QUERY] * len(DOCS), second: DOCS})
        assert scores_of(route, pairwise.json()) == pytest.approx(scores_of(route, expected), abs=1e-6)


@pytest.mark.parametrize("first, second", [("queries", "documents"), ("data_1", "data_2")])
def test_score_errors_name_the_sides_as_sent(client, fake, first, second) -> None:
    assert _error(client.post("/v1/score", json={first: QUERY, second: ["ok", ""]}))[:2] == (400, f"{second}[1]")
    assert _error(client.post("/v1/score", json={first: "", second: DOCS}))[:2] == (400, first)
    code, named, message = _error(client.post("/v1/score", json={first: ["a"] * (len(DOCS) + 1), second: DOCS}))
    assert (code, named) == (422, first) and f"as {second} ({len(DOCS)})" in message
    too_many = ["x"] * 2049
    assert _error(client.post("/v1/score", json={first: QUERY, second: too_many}))[1] == second
    assert fake.calls == []


def test_text_1_wins_over_the_newer_names(client) -> None:
    both = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS[:1], "queries": "x", "documents": DOCS})
    assert both.status_code == 200 and len(both.json()["data"]) == 1


# ---- rerank's documents ----

def test_rerank_returns_documents_unless_told_not_to_or_at_cohere_v2(client) -> None:
    body = {"query": QUERY, "documents": DOCS}
    for route, echoed in (("/rerank", True), ("/v1/rerank", True), ("/v2/rerank", False)):
        results = client.post(route, json=body).json()["results"]
        assert all(("document" in x) is echoed for x in results), route
        if echoed:
            assert [x["document"] for x in results] == [{"text": DOCS[x["index"]]} for x in results]
        for asked in (True, False):
            again = client.post(route, json={**body, "return_documents": asked}).json()["results"]
            assert all(("document" in x) is asked for x in again), (route, asked)
    top = client.post("/v1/rerank", json={**body, "top_n": 1}).json()["results"]
    assert len(top) == 1 and top[0]["document"] == {"text": DOCS[top[0]["index"]]}
    assert np.isfinite(top[0]["relevance_score"])


# ---- Cohere v2's max_tokens_per_doc, and its documents cut rather than refused ----

LONG_DOC = "the quick brown fox jumps over the lazy dog " * 30  # 272 tokens with the specials: over MiniLM's 256


def _cut(text: str, k: int, side: str = "right") -> str:
    """text's first (last) k tokens as text, by the `tokenizers` library's own offsets: the expected cut."""
    from rose.spec import bundled_model_dir, load_spec
    from rose.tokenizer import Tokenizer

    (enc,) = Tokenizer(load_spec(bundled_model_dir())).hf.encode_batch([text], add_special_tokens=False)
    if len(enc.offsets) <= k:
        return text
    return text[:enc.offsets[k - 1][1]] if side == "right" else text[enc.offsets[-k][0]:]


@pytest.mark.parametrize("side", ["right", "left"])
def test_max_tokens_per_doc_scores_each_document_cut_to_k_tokens(client, side) -> None:
    docs = [LONG_DOC, "cats sleep on the sofa all day long", "stock"]
    for route in ("/v1/rerank", "/v2/rerank", "/rerank"):
        body = {"query": QUERY, "documents": docs, "max_tokens_per_doc": 5, "truncation_side": side,
                "return_documents": True}
        r = client.post(route, json=body)
        assert r.status_code == 200, r.text
        expected = client.post(route, json={**body, "documents": [_cut(d, 5, side) for d in docs],
                                            "max_tokens_per_doc": None}).json()
        assert scores_of(route, r.json()) == pytest.approx(scores_of(route, expected), abs=1e-6)
        assert r.json()["usage"] == expected["usage"], route
        assert {x["index"]: x["document"]["text"] for x in r.json()["results"]} == dict(enumerate(docs))  # as sent
    assert _cut(docs[1], 5, side) != docs[1] and _cut(docs[2], 5, side) == docs[2]  # the cut did something


def test_cohere_v2_cuts_long_documents_by_default(client, fake) -> None:
    body = {"query": QUERY, "documents": [LONG_DOC, DOCS[0]]}
    r = client.post("/v2/rerank", json=body)
    assert r.status_code == 200, r.text
    assert client.post("/v2/rerank", json={**body, "truncate": False}).status_code == 422  # asked for
    assert client.post("/v1/rerank", json=body).status_code == 422  # the server default elsewhere (off)
    assert client.post("/v1/rerank", json={**body, "max_tokens_per_doc": 4096}).status_code == 200


@pytest.mark.parametrize("extra, param", [({"max_tokens_per_doc": 0}, "max_tokens_per_doc"),
                                          ({"max_tokens_per_doc": "5"}, "max_tokens_per_doc"),
                                          ({"max_tokens_per_doc": 5, "truncate": False}, "truncate")])
def test_max_tokens_per_doc_errors_name_the_field(client, fake, extra, param) -> None:
    for route in ("/v1/rerank", "/v2/rerank"):
        code, named, _ = _error(client.post(route, json={"query": QUERY, "documents": DOCS, **extra}))
        assert (code, named) == (422, param), route
    assert fake.calls == []


def test_max_tokens_per_doc_cuts_a_cross_encoders_documents_before_pairing(tmp_path) -> None:
    fake = FakeTulip(model_dir=bert_reranker(tmp_path))
    with fake, gateway(fake, model=str(fake.model_dir)) as client:
        docs = ["cats sleep on the sofa all day long", "stock prices fell today"]
        body = {"query": QUERY, "documents": docs}
        r = client.post("/v2/rerank", json={**body, "max_tokens_per_doc": 3})
        expected = client.post("/v2/rerank", json={**body, "documents": [_cut(d, 3) for d in docs]})
        assert r.status_code == 200 and scores_of("/v2/rerank", r.json()) == scores_of("/v2/rerank", expected.json())
        assert scores_of("/v2/rerank", r.json()) != scores_of("/v2/rerank", client.post("/v2/rerank", json=body).json())


# ---- found in review: the newer fields' edges ----

def test_tei_rerank_body_honours_max_tokens_per_doc_too(client) -> None:
    docs = ["cats sleep on the sofa all day long", "stock prices fell today"]
    cut = client.post("/rerank", json={"query": QUERY, "texts": docs, "max_tokens_per_doc": 1}).json()
    expected = client.post("/rerank", json={"query": QUERY, "texts": [_cut(d, 1) for d in docs]}).json()
    assert scores_of("/rerank", cut) == pytest.approx(scores_of("/rerank", expected), abs=1e-6)
    whole = client.post("/rerank", json={"query": QUERY, "texts": docs}).json()
    assert scores_of("/rerank", cut) != scores_of("/rerank", whole)


def test_nulls_of_the_newer_fields_are_as_omitted(client) -> None:
    body = {"query": QUERY, "documents": DOCS}
    plain = client.post("/v1/rerank", json=body).json()
    for null in ({"raw_scores": None}, {"use_activation": None}, {"return_documents": None},
                 {"max_tokens_per_doc": None}):
        r = client.post("/v1/rerank", json={**body, **null})
        assert r.status_code == 200 and r.json()["results"] == plain["results"], (null, r.text)


def test_score_sides_sent_as_one_string_are_named_as_the_side(client, fake) -> None:
    words = "word " * 600
    for sides, param in ((("queries", "documents"), "queries"), (("data_1", "data_2"), "data_1")):
        r = client.post("/v1/score", json={sides[0]: words, sides[1]: ["a"]})
        assert r.status_code == 422 and r.json()["error"]["param"] == param, r.text
    r = client.post("/v1/score", json={"queries": "q", "documents": words})
    assert r.status_code == 422 and r.json()["error"]["param"] == "documents", r.text
    assert fake.calls == []


def test_score_sides_skip_nulls_and_refuse_a_mix_of_namings(client) -> None:
    expected = client.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS[:1]}).json()["data"]
    for body in ({"queries": QUERY, "items": DOCS[:1], "documents": None},
                 {"text_1": None, "text_2": None, "queries": QUERY, "documents": DOCS[:1]}):
        r = client.post("/v1/score", json=body)
        assert r.status_code == 200 and r.json()["data"] == expected, (body, r.text)
    for body, param, says in (({"text_1": QUERY, "documents": DOCS}, "text_1", "mixed"),
                              ({"queries": QUERY, "text_2": DOCS}, "text_2", "mixed"),
                              ({"queries": QUERY}, "queries", "documents or items"),
                              ({"data_2": DOCS}, "data_2", "data_1"),
                              ({"queries": QUERY, "documents": DOCS, "items": ["zz"]}, "items", "one pair"),
                              ({"queries": QUERY, "documents": DOCS, "data_1": "zz"}, "data_1", "one pair")):
        code, named, message = _error(client.post("/v1/score", json=body))
        assert (code, named) == (422, param) and says in message, (body, message)


def test_max_tokens_per_doc_cuts_nothing_before_the_request_is_checked(client, fake, monkeypatch) -> None:
    from ivy.token_texts import TokenTexts

    async def no_cut(*args, **kwargs):
        raise AssertionError("documents tokenized before the request was checked")

    monkeypatch.setattr(TokenTexts, "cut_to_tokens", no_cut)
    body = {"query": QUERY, "documents": DOCS * 25, "max_tokens_per_doc": 1, "instruction": "x"}
    assert _error(client.post("/v2/rerank", json=body))[:2] == (422, "instruction")
    assert fake.calls == []


def test_max_tokens_per_doc_on_a_tokenizer_without_offsets_names_itself(client, monkeypatch) -> None:
    gw = client.app.state.gateway
    monkeypatch.setattr(gw.tokenizer, "_hf", None)
    code, named, message = _error(client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS,
                                                                   "max_tokens_per_doc": 2}))
    assert (code, named) == (400, "max_tokens_per_doc") and message.startswith("max_tokens_per_doc:"), message


def test_embed_dtype_beside_a_models_own_int8_default_is_ignored_as_under_vllms_float(tmp_path) -> None:
    """pplx-embed defaults to base64_int8; a vLLM client's embed_dtype, meant for vLLM's default (float, which
    ignores it), changes nothing; sent with base64_int8 itself it is a 422."""
    from ivy_testkit import model_copy

    folder = model_copy(tmp_path, "pplx-embed-tiny", config={"model_type": "bidirectional_pplx_qwen3"})
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as c:
        plain = c.post("/v1/embeddings", json={"input": "hi"}).json()["data"]
        r = c.post("/v1/embeddings", json={"input": "hi", "embed_dtype": "float16"})
        assert r.status_code == 200 and r.json()["data"] == plain, r.text
        sent = c.post("/v1/embeddings", json={"input": "hi", "embed_dtype": "float16",
                                              "encoding_format": "base64_int8"})
        assert _error(sent)[:2] == (422, "embed_dtype") and "float16" not in _error(sent)[2]


# ---- the rerank routes: Cohere v1's fields, vLLM's older names ----

def test_cohere_v1_fields_that_would_change_the_answer_are_refused(client, fake) -> None:
    docs = [{"text": "stock prices", "title": "cats sleep"}]
    plain = client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "rank_fields": ["text"],
                                            "max_chunks_per_doc": 10})
    assert plain.status_code == 200, plain.text  # the text is what is scored; short documents are never chunked
    calls = len(fake.calls)
    for extra, param in (({"rank_fields": ["title"]}, "rank_fields"),
                         ({"max_chunks_per_doc": 10, "truncate": True}, "max_chunks_per_doc")):
        code, named, _ = _error(client.post("/v1/rerank", json={"query": QUERY, "documents": docs, **extra}))
        assert (code, named) == (422, param)
    assert len(fake.calls) == calls
    assert client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "max_chunks_per_doc": 1,
                                           "truncate": True}).status_code == 200


def test_vllms_older_activation_names_are_use_activation(tmp_path) -> None:
    """vLLM's softmax and activation (deprecated names of use_activation) on the score and rerank routes: false
    is the raw logits, true the activated scores (activation: true was a 422 taken for a misspelling)."""
    fake = FakeTulip(model_dir=bert_reranker(tmp_path))
    with fake, gateway(fake, model=str(fake.model_dir)) as client:
        for route, body, _ in _raw_asks(QUERY, DOCS)[:4]:
            plain = {k: v for k, v in body.items() if k != "use_activation"}
            raw = scores_of(route, client.post(route, json=body).json())
            activated = scores_of(route, client.post(route, json=plain).json())
            for old in ("softmax", "activation"):
                assert scores_of(route, client.post(route, json={**plain, old: False}).json()) == raw, (route, old)
                r = client.post(route, json={**plain, old: True})
                assert r.status_code == 200 and scores_of(route, r.json()) == activated, (route, old)


def test_jinas_late_chunking_is_one_document_s_chunks(client, fake, tmp_path) -> None:
    """late_chunking: true embeds the inputs as /v1/contextualizedembeddings embeds one document of those chunks
    (each chunk's span pooled with the others as its context), in /v1/embeddings' shape; ids, a prompt and a
    document over the model's length are refused by name."""
    chunks = ["Berlin is the capital of Germany.", "It has 3.8 million people.", "Its river is the Spree."]
    late = client.post("/v1/embeddings", json={"input": chunks, "late_chunking": True})
    assert late.status_code == 200, late.text
    calls = fake.calls[-1]
    assert calls.seqs == 1 and calls.rows == 3  # one sequence, a row per chunk's span
    ctx = client.post("/v1/contextualizedembeddings", json={"input": [chunks], "encoding_format": "float"}).json()
    assert [d["embedding"] for d in late.json()["data"]] == [d["embedding"] for d in ctx["data"][0]["data"]]
    assert late.json()["usage"] == ctx["usage"]
    plain = client.post("/v1/embeddings", json={"input": chunks}).json()
    assert [d["embedding"] for d in plain["data"]] != [d["embedding"] for d in late.json()["data"]]
    n = len(fake.calls)
    for body, param in (({"input": [[101, 2003, 102]], "late_chunking": True}, "late_chunking"),
                        ({"input": ["word " * 200, "word " * 200], "late_chunking": True}, "input")):
        code, named, message = _error(client.post("/v1/embeddings", json=body))
        assert (code, named) == (422, param), message
    assert len(fake.calls) == n
    folder = model_copy(tmp_path, "prompted", st_config={"prompts": {"query": "query: ", "document": "passage: "}})
    prompted = FakeTulip(model_dir=folder)
    with prompted, gateway(prompted, model=str(folder)) as c:
        code, named, message = _error(c.post("/v1/embeddings", json={"input": chunks, "late_chunking": True,
                                                                     "task": "retrieval.passage"}))
        assert (code, named) == (422, "late_chunking") and "prompt" in message and not prompted.calls

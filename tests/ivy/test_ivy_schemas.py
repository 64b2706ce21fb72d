"""Request parsing: the input shapes OpenAI and Perplexity accept, and errors that name the element."""

import numpy as np
import pytest

from ivy.errors import IvyError, Problem, field_path
from ivy.inputs import parse_documents_of_chunks, parse_inputs, parse_texts
from ivy.schemas import EmbeddingsRequest


def test_input_shapes() -> None:
    assert parse_inputs("hi").texts == ["hi"]
    assert parse_inputs(["a", "b"]).texts == ["a", "b"]
    assert parse_inputs([1, 2, 3]).ids == [[1, 2, 3]]
    assert parse_inputs([[1], [2, 3]]).ids == [[1], [2, 3]]
    assert len(parse_inputs([[1], [2, 3]])) == 2


def test_an_int_subclass_is_refused_by_name_not_by_a_crash() -> None:
    class Id(int):
        pass

    with pytest.raises(IvyError) as info:
        parse_inputs([[1, Id(2)]])
    assert info.value.param == "input[0][1]"


@pytest.mark.parametrize("value, problem, param", [
    ([], Problem.EMPTY_INPUT, "input"),
    ("", Problem.EMPTY_INPUT, "input"),
    (["a", ""], Problem.EMPTY_INPUT, "input[1]"),
    ([[1], []], Problem.EMPTY_INPUT, "input[1]"),
    (["a", 3], Problem.INVALID_PARAMETER, "input[1]"),
    ([1, True], Problem.INVALID_PARAMETER, "input[1]"),
    ([1, 2.5], Problem.INVALID_PARAMETER, "input[1]"),
    ([[1, "x"]], Problem.INVALID_PARAMETER, "input[0][1]"),
    ([[1, 2], [3] * 4000 + [False] + [4]], Problem.INVALID_PARAMETER, "input[1][4000]"),
    ([[1, 2], [3] * 4000 + [None]], Problem.INVALID_PARAMETER, "input[1][4000]"),
    ([7] * 4095 + [1.0], Problem.INVALID_PARAMETER, "input[4095]"),
    ([{"a": 1}], Problem.INVALID_PARAMETER, "input[0]"),
    (7, Problem.INVALID_PARAMETER, "input"),
    (None, Problem.INVALID_PARAMETER, "input"),
])
def test_bad_inputs_name_the_element(value, problem, param) -> None:
    with pytest.raises(IvyError) as info:
        parse_inputs(value)
    assert info.value.problem is problem and info.value.param == param
    assert param in info.value.message


def test_documents_of_chunks_and_rerank_documents() -> None:
    assert parse_documents_of_chunks([["a", "b"], ["c"]]) == [["a", "b"], ["c"]]
    with pytest.raises(IvyError) as info:
        parse_documents_of_chunks([["a"], ["b", ""]])
    assert info.value.param == "input[1][1]" and info.value.status == 400
    with pytest.raises(IvyError) as info:
        parse_documents_of_chunks([["a"], []])
    assert info.value.param == "input[1]"
    assert parse_texts(["a", {"text": "b", "id": 3}], "documents") == ["a", "b"]
    with pytest.raises(IvyError) as info:
        parse_texts(["a", {"txt": "b"}], "documents")
    assert info.value.param == "documents[1]"


def test_strict_types_and_ignored_extras() -> None:
    body = EmbeddingsRequest.model_validate({"input": "a", "dimensions": 8, "unknown_field": 1})
    assert body.dimensions == 8 and body.truncation_side == "right"
    with pytest.raises(Exception):
        EmbeddingsRequest.model_validate({"input": "a", "dimensions": "8"})


def test_field_path() -> None:
    assert field_path(("input", 0, "text")) == "input[0].text"
    assert field_path(()) == "body"


def test_a_near_miss_beside_the_field_it_is_close_to_is_told_to_go_not_to_be_renamed(client) -> None:
    """Review: a client mixing OpenAI's `input` and TEI's `inputs` was told "did you mean 'input'?" while it sent
    `input`; the message still never echoes the client's key."""
    r = client.post("/v1/embeddings", json={"input": "a", "inputs": "b"})
    error = r.json()["error"]
    assert r.status_code == 422 and error["param"] == "input", r.text
    assert error["message"] == "the body has 'input' and also a field close to it that is not served; remove that field"
    assert "inputs" not in r.text and "did you mean" not in r.text
    alone = client.post("/v1/embeddings", json={"inputz": "b"}).json()["error"]
    assert alone["message"] == ("the body has a field that is not served but is close to 'input' (a misspelling?); "
                                "rename it to 'input' or remove it") and alone["param"] == "input"


def test_near_miss_field_names_are_422_unrelated_extras_ignored_peer_aliases_read(client) -> None:
    r = client.post("/v1/embeddings", json={"input": "a", "dimension": 64})
    assert r.status_code == 422 and r.json()["error"]["param"] == "dimensions"  # the field meant, not the key sent
    assert "close to 'dimensions' (a misspelling?); rename it to 'dimensions' or remove it" in r.json()["error"][
        "message"]
    ok = client.post("/v1/embeddings", json={"input": "a", "dimensions": 64, "vendor_extra": {"x": 1}})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 64
    docs = ["a cat", "a dog", "a car"]
    top = client.post("/v1/rerank", json={"query": "cat", "documents": docs, "top_k": 1})  # Voyage's name
    assert top.status_code == 200 and len(top.json()["results"]) == 1
    assert client.post("/v1/rerank", json={"query": "cat", "documents": docs, "top_m": 1}).status_code == 422
    # what the voyageai SDK sends on every call, and Jina's flag: read, not refused as near misses
    voyage = client.post("/v1/rerank", json={"query": "cat", "documents": docs, "top_k": 2, "truncation": True})
    assert voyage.status_code == 200 and len(voyage.json()["results"]) == 2
    long = client.post("/v1/embeddings", json={"input": "word " * 400, "truncation": True, "normalized": True})
    assert long.status_code == 200 and long.json()["usage"]["prompt_tokens"] == 256


def test_token_ids_must_fit_the_embedding_table_as_well_as_the_tokenizer(tmp_path) -> None:
    """Ivy refuses what a replica would: ids past config.json's vocab_size even when the tokenizer is larger."""
    import asyncio

    import pytest

    from ivy.errors import IvyError
    from ivy.tokenization import InputEncoder
    from ivy_testkit import model_copy
    from rose.spec import load_spec
    from rose.tokenizer import Tokenizer

    spec = load_spec(model_copy(tmp_path, "small-table", config={"vocab_size": 1000}))
    encoder = InputEncoder(spec, Tokenizer(spec), threads=1, char_cap=4096)
    try:
        checked = asyncio.run(encoder.check_ids([[5, 999]], truncate=False, side="right"))
        assert [c.tolist() for c in checked] == [[5, 999]] and checked[0].dtype == np.int32  # packed as is
        with pytest.raises(IvyError) as err:
            asyncio.run(encoder.check_ids([[5, 1000]], truncate=False, side="right"))
        assert err.value.param == "input[0][1]" and "0..999" in err.value.message
    finally:
        encoder.close()


def test_misspelling_check_is_bounded_and_other_vendors_dimension_names_are_read(client, monkeypatch) -> None:
    import difflib

    import ivy.body

    calls = []
    real = difflib.get_close_matches
    monkeypatch.setattr(ivy.body.difflib, "get_close_matches", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    flood = {f"k{i:06d}_xx": 1 for i in range(20000)}  # a body of unknown keys: ignored, with bounded work
    r = client.post("/v1/embeddings", json={"input": "a", **flood})
    assert r.status_code == 200 and len(calls) <= 16
    for name in ("output_dimension", "truncate_dim"):  # Voyage / Cohere v2, sentence-transformers
        got = client.post("/v1/embeddings", json={"input": "a", name: 16})
        assert got.status_code == 200 and len(got.json()["data"][0]["embedding"]) == 16, name


def test_prompt_name_applies_to_texts_only_and_limits_are_checked_first(client) -> None:
    ids = client.post("/v1/embeddings", json={"input": [[101, 7592, 102]], "prompt_name": "nope"})
    assert ids.status_code == 200  # no templating for token ids, as before
    both = client.post("/v1/embeddings", json={"input": "a", "dimensions": 9999, "prompt_name": "nope"})
    assert both.status_code == 422 and both.json()["error"]["param"] == "dimensions"



def test_checked_ids_and_tokenizer_lists_pack_to_the_same_wire_bytes() -> None:
    """ivy.encode.packed_ids: the int32 arrays check_ids returns are joined as they are, a tokenizer's lists are
    flattened, a mix (a coalesced call of ids and texts) falls back to the flattening; all give the same bytes."""
    from ivy.encode import embed_request, packed_ids

    lists = [[101, 7592, 102], [101, 2088, 2003, 102]]
    arrays = [np.asarray(s, dtype=np.int32) for s in lists]
    want = np.asarray([t for s in lists for t in s], dtype="<i4").tobytes()
    assert packed_ids(lists, 7) == packed_ids(arrays, 7) == packed_ids([arrays[0], lists[1]], 7) == want
    assert embed_request(arrays, 7, dimensions=0, normalize=None, encoding=0, request_id="r").token_ids == want
    with pytest.raises(ValueError, match="7 ids where 6 were counted"):
        packed_ids(arrays, 6)


def test_near_misses_inside_a_nested_body_object_are_422_naming_its_path(client, monkeypatch) -> None:
    """/similarity's `parameters` (where TEI's clients put truncate / truncation_direction / prompt_name) and
    `inputs` are body models of their own: a near miss there was served as if absent ("truncation_sid" ignored,
    the text cut on the right) where the same key at the top level is a 422. Same check, the field named by its
    path; other keys there stay ignored, TEI's truncation_direction is read, and the work stays bounded."""
    import difflib

    import ivy.body

    long = "the quick brown fox jumps over the lazy dog " * 40  # over MiniLM's 256 tokens
    inputs = {"source_sentence": long, "sentences": ["dog"]}
    r = client.post("/similarity", json={"inputs": inputs, "parameters": {"truncate": True, "truncation_sid": "left"}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "parameters.truncation_side"
    assert "rename it to 'parameters.truncation_side'" in error["message"] and "truncation_sid'" not in error["message"]
    typo = client.post("/similarity", json={"inputs": {**inputs, "source_sentenc": "a"}})
    assert typo.status_code == 422 and typo.json()["error"]["param"] == "inputs.source_sentence"
    for fine in ({"truncate": True, "vendor_extra": 1}, {"truncate": True, "truncation_direction": "Left"}):
        assert client.post("/similarity", json={"inputs": inputs, "parameters": fine}).status_code == 200, fine
    calls = []
    real = difflib.get_close_matches
    monkeypatch.setattr(ivy.body.difflib, "get_close_matches", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    flood = {f"k{i:06d}_xx": 1 for i in range(20000)}
    r = client.post("/similarity", json={"inputs": {**inputs, **flood}, "parameters": {**flood, "truncate": True},
                                         **flood})
    assert r.status_code == 200 and len(calls) <= 16

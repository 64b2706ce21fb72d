"""POST /tokenize for both peers' clients: vLLM's body with `return_token_strs` (its TokenizeResponse's `token_strs`,
null when not asked for), and text-embeddings-inference's body (`inputs`, `add_special_tokens`, `prompt_name`)
answered as TEI answers it: per input a list of {"id", "text", "special", "start", "stop"}, a special token with its
vocabulary string and null offsets, any other with the text it covers and its UTF-8 byte offsets (TEI's into_tokens
over Rust `tokenizers`' byte offsets; the Python library's are characters)."""

from __future__ import annotations

import pytest
from fake_tulip import FakeTulip
from ivy_testkit import gateway, model_copy
from tokenizers import Tokenizer as HFTokenizer

from rose.spec import bundled_model_dir

ASCII = "Hello embeddings, a [SEP] b"  # "[SEP]" in the text: the library does not mark it special
OTHER = "naïve café 東京 🚀!"  # 2-, 3- and 4-byte characters


def _library() -> HFTokenizer:
    """The bundled model's tokenizer.json as `tokenizers` itself reads it (its padding off, as Ivy and TEI run it)."""
    tok = HFTokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


LIB = _library()


def _expected(text: str, add_special_tokens: bool = True) -> list[dict]:
    """TEI's tokens for `text` from the library's own encoding, character offsets turned into byte offsets."""
    enc = LIB.encode(text, add_special_tokens=add_special_tokens)
    out = []
    for i, token, (start, stop), special in zip(enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask):
        if special:
            out.append({"id": i, "text": token, "special": True, "start": None, "stop": None})
        else:
            out.append({"id": i, "text": text[start:stop], "special": False,
                        "start": len(text[:start].encode()), "stop": len(text[:stop].encode())})
    return out


def _vllm_ids(client, text: str, add_special_tokens: bool = True) -> list[int]:
    r = client.post("/tokenize", json={"prompt": text, "add_special_tokens": add_special_tokens})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_return_token_strs_gives_the_vocabularys_tokens(client) -> None:
    for text in (ASCII, OTHER):
        r = client.post("/tokenize", json={"prompt": text, "return_token_strs": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["token_strs"] == LIB.encode(text).tokens and len(body["token_strs"]) == body["count"]
        assert body["token_strs"] == [LIB.id_to_token(i) for i in body["tokens"]]
    bare = client.post("/tokenize", json={"prompt": "embeddings", "add_special_tokens": False,
                                          "return_token_strs": True}).json()
    assert bare["token_strs"] == ["em", "##bed", "##ding", "##s"]


def test_token_strs_is_null_unless_asked_for_as_vllm_answers(client) -> None:
    for extra in ({}, {"return_token_strs": False}, {"return_token_strs": None}):
        body = client.post("/tokenize", json={"prompt": ASCII, **extra}).json()
        assert "token_strs" in body and body["token_strs"] is None, body
        assert body["tokens"] == LIB.encode(ASCII).ids and body["count"] == len(body["tokens"])
    r = client.post("/tokenize", json={"prompt": ASCII, "return_token_strs": "yes"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "return_token_strs"


def test_tei_body_with_a_string_is_one_list_of_tokens(client) -> None:
    r = client.post("/tokenize", json={"inputs": ASCII})
    assert r.status_code == 200, r.text
    (tokens,) = r.json()
    assert tokens == _expected(ASCII)
    assert [t["id"] for t in tokens] == _vllm_ids(client, ASCII)
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[1] == {"id": 7592, "text": "Hello", "special": False, "start": 0, "stop": 5}  # the text's own case
    assert [t["text"] for t in tokens[2:6]] == ["em", "bed", "ding", "s"]  # the spans, not "##bed"


def test_tei_body_with_a_list_and_byte_offsets(client) -> None:
    r = client.post("/tokenize", json={"inputs": [ASCII, OTHER]})
    assert r.status_code == 200, r.text
    ascii_tokens, other_tokens = r.json()
    assert ascii_tokens == _expected(ASCII) and other_tokens == _expected(OTHER)
    assert [t["id"] for t in other_tokens] == _vllm_ids(client, OTHER)
    # byte offsets, not characters: "café" is characters 6..10 but bytes 7..12; the rocket 4 bytes
    cafe = next(t for t in other_tokens if t["text"] == "café")
    assert (cafe["start"], cafe["stop"]) == (7, 12) and OTHER.encode()[7:12].decode() == "café"
    rocket = next(t for t in other_tokens if t["text"] == "🚀")
    assert rocket["stop"] - rocket["start"] == 4 and rocket["id"] == LIB.token_to_id("[UNK]")
    enc = LIB.encode(OTHER)
    assert [t["special"] for t in other_tokens] == [bool(m) for m in enc.special_tokens_mask]


def test_tei_body_without_special_tokens(client) -> None:
    r = client.post("/tokenize", json={"inputs": [ASCII], "add_special_tokens": False})
    assert r.status_code == 200, r.text
    (tokens,) = r.json()
    assert tokens == _expected(ASCII, add_special_tokens=False)
    assert [t["id"] for t in tokens] == _vllm_ids(client, ASCII, add_special_tokens=False)
    assert not any(t["special"] for t in tokens) and tokens[0]["start"] == 0


def test_tei_prompt_name_is_prepended_as_tei_does(tmp_path) -> None:
    folder = model_copy(tmp_path, "prompted", st_config={"prompts": {"query": "query: "}})
    with FakeTulip(model_dir=folder) as fake, gateway(fake, model=str(folder)) as client:
        r = client.post("/tokenize", json={"inputs": ["hello world"], "prompt_name": "query"})
        assert r.status_code == 200, r.text
        (tokens,) = r.json()
        assert tokens == _expected("query: hello world")  # the prompt's tokens too, offsets in the prompted text
        assert [t["text"] for t in tokens[1:3]] == ["query", ":"] and tokens[3]["start"] == 7
        plain = client.post("/tokenize", json={"inputs": "hello world"}).json()
        assert plain == [_expected("hello world")]
        r = client.post("/tokenize", json={"inputs": "hello", "prompt_name": "nope"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "prompt_name"


def test_unknown_prompt_name_is_a_422(client) -> None:
    r = client.post("/tokenize", json={"inputs": ["hello"], "prompt_name": "query"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompt_name"


@pytest.mark.parametrize("inputs, status, param", [
    ([], 400, "inputs"),
    ("", 400, "inputs"),
    (["a", ""], 400, "inputs[1]"),
    (["a", 3], 422, "inputs[1]"),
    (["a", {"text": "b"}], 422, "inputs[1]"),
    (7, 422, "inputs"),
])
def test_tei_errors_name_the_field(client, inputs, status, param) -> None:
    r = client.post("/tokenize", json={"inputs": inputs})
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_tei_text_over_the_cap_is_named(client) -> None:
    r = client.post("/tokenize", json={"inputs": ["ok", "x" * (64 * 4096 + 1)]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "inputs[1]", r.text
    r = client.post("/tokenize", json={"inputs": "x" * (64 * 4096 + 1)})
    assert r.status_code == 422 and r.json()["error"]["param"] == "inputs", r.text


def test_tei_inputs_count_limit(fake) -> None:
    with gateway(fake, max_inputs_per_request=4) as client:
        assert client.post("/tokenize", json={"inputs": ["a"] * 4}).status_code == 200
        for inputs in (["a"] * 5, ["a"] * 5 + [3]):  # the count first, whatever follows in the list
            r = client.post("/tokenize", json={"inputs": inputs})
            error = r.json()["error"]
            assert r.status_code == 422 and error["code"] == "too_many_inputs" and error["param"] == "inputs", r.text
            assert "at most 4" in error["message"]
    assert fake.calls == []


def test_a_body_with_prompt_is_vllms(client) -> None:
    body = client.post("/tokenize", json={"prompt": "hi", "inputs": ["ignored"], "return_token_strs": True}).json()
    assert body["tokens"] == LIB.encode("hi").ids and body["token_strs"] == ["[CLS]", "hi", "[SEP]"]
    assert client.post("/tokenize", json={}).json()["error"]["param"] == "prompt"


def test_openapi_documents_both_bodies_and_answers(client) -> None:
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/tokenize"]["post"]
    bodies = post["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert [b["title"] for b in bodies] == ["TokenizeRequest", "TeiTokenizeRequest"]
    assert "return_token_strs" in bodies[0]["properties"] and "prompt_name" in bodies[1]["properties"]
    answers = post["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    assert {a["$ref"].rsplit("/", 1)[1] for a in answers} == {"TokenizeResponse", "TeiTokenizeResponse"}
    assert "token_strs" in spec["components"]["schemas"]["TokenizeResponse"]["properties"]
    assert set(spec["components"]["schemas"]["SimpleToken"]["properties"]) == {"id", "text", "special", "start",
                                                                               "stop"}


def test_tei_inputs_together_take_the_cap_of_one_text(client) -> None:
    """~67 bytes are answered for a one-character token: 2 MB of such texts under the per-text cap alone were a
    141 MB answer and a 440 ms stretch of the event loop. All the texts of a request share /tokenize's cap."""
    cap = 64 * client.app.state.gateway.encoder.char_cap
    part = cap // 8
    fits = client.post("/tokenize", json={"inputs": ["." * part] * 8})
    assert fits.status_code == 200 and [len(t) for t in fits.json()] == [part + 2] * 8
    r = client.post("/tokenize", json={"inputs": ["." * part] * 8 + ["."]})
    error = r.json()["error"]
    assert r.status_code == 422 and error["param"] == "inputs" and f"at most {cap}" in error["message"], error


def test_a_long_texts_tokens_are_answered_as_one_list_across_json_chunks(client) -> None:
    """The answer is built JSON_CHUNK tokens at a time (ivy.offsets.simple_tokens_json): the same tokens, in order,
    across the chunks' seams, as the library gives them."""
    from ivy.offsets import JSON_CHUNK

    text = " ".join(f"w{i % 97} café" for i in range(JSON_CHUNK))  # ~3 chunks of tokens, multi-byte included
    (tokens,) = client.post("/tokenize", json={"inputs": [text]}).json()
    assert len(tokens) > 2 * JSON_CHUNK
    assert tokens == _expected(text)

"""Bodies: the payload cap before parsing, bounded decompression, UTF-8 and JSON errors (RELIABILITY 4, 5, 8, 9)."""

from __future__ import annotations

import gzip
import json
import zlib

from ivy_testkit import gateway

LIMIT = 4096


def _post(client, content, headers=None):
    return client.post("/v1/embeddings", content=content, headers={"Content-Type": "application/json",
                                                                     **(headers or {})})


def test_declared_body_over_limit_is_413_before_reading(fake) -> None:
    with gateway(fake, payload_limit_bytes=LIMIT) as client:
        r = _post(client, json.dumps({"input": "x" * 10 * LIMIT}))
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "payload_too_large" and str(LIMIT) in err["message"]
    assert fake.calls == []


def test_streamed_body_over_limit_is_413(fake) -> None:
    def chunks():  # chunked transfer: no Content-Length to check
        yield b'{"input": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    with gateway(fake, payload_limit_bytes=LIMIT) as client:
        r = _post(client, chunks())
        ok = _post(client, iter([b'{"input": ', b'"short"}']))
    assert r.status_code == 413
    assert ok.status_code == 200


def test_gzip_bomb_is_413_and_small_gzip_works(fake) -> None:
    bomb = gzip.compress(json.dumps({"input": "a " * 100_000}).encode())
    assert len(bomb) < LIMIT
    with gateway(fake, payload_limit_bytes=LIMIT) as client:
        r = _post(client, bomb, {"Content-Encoding": "gzip"})
        ok = _post(client, gzip.compress(b'{"input": ["hello"]}'), {"Content-Encoding": "gzip"})
        deflated = _post(client, zlib.compress(b'{"input": ["hello"]}'), {"Content-Encoding": "deflate"})
        raw = zlib.compressobj(wbits=-15)
        raw_deflate = _post(client, raw.compress(b'{"input": "hi"}') + raw.flush(), {"Content-Encoding": "deflate"})
        corrupt = _post(client, b"not gzip at all", {"Content-Encoding": "gzip"})
        brotli = _post(client, b"{}", {"Content-Encoding": "br"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]["message"]
    assert ok.status_code == 200 and deflated.status_code == 200 and raw_deflate.status_code == 200
    assert corrupt.status_code == 400
    assert brotli.status_code == 415


def test_a_compressed_body_is_read_whole_or_refused(fake) -> None:
    """RELIABILITY 45: gzip members back to back are one body (RFC 1952; what `gzip.decompress` and streaming
    compressors produce); only the first was read, so a JSON body split over two was a 400, and whatever
    followed a first member or a deflate stream (a second document, garbage) was dropped without a word, as
    was a stream cut before its end. Now every member is inflated, under the same cap; anything else after a
    stream, or a stream that never ends, is a 400 naming the body."""
    body = json.dumps({"input": ["hello world"]}).encode()
    half = len(body) // 2
    with gateway(fake, payload_limit_bytes=LIMIT) as client:
        members = _post(client, gzip.compress(body[:half]) + gzip.compress(body[half:]), {"Content-Encoding": "gzip"})
        bomb = _post(client, gzip.compress(b'{"input": "') + gzip.compress(b"a" * 10 * LIMIT + b'"}'),
                     {"Content-Encoding": "gzip"})
        refused = [_post(client, data, {"Content-Encoding": encoding}) for encoding, data in (
            ("gzip", gzip.compress(body) + b"GARBAGE"),
            ("gzip", gzip.compress(body) + zlib.compress(b'{"input": "x"}')),
            ("gzip", gzip.compress(body)[:-8]),  # no trailer
            ("deflate", zlib.compress(body) + zlib.compress(b'{"input": "x"}')),
            ("deflate", zlib.compress(body)[:-4]),
        )]
    assert members.status_code == 200, members.text
    assert bomb.status_code == 413 and "decompressed" in bomb.json()["error"]["message"]
    for r in refused:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "body" and "compressed body" in r.json()["error"]["message"]
    assert len(fake.calls) == 1


def test_invalid_utf8_is_400_never_500(client) -> None:
    r = _post(client, b'{"input": "caf\xe9"}')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_utf8"
    surrogate = _post(client, b'{"input": "\\udc80abc"}')
    assert surrogate.status_code == 400 and surrogate.json()["error"]["code"] == "invalid_utf8"
    emoji = _post(client, b'{"input": "\\ud83d\\ude00 ok"}')
    assert emoji.status_code == 200


def test_bad_json_and_wrong_types(client) -> None:
    assert _post(client, b'{"input": ').status_code == 400
    assert _post(client, b"").status_code == 400
    for body, param in [(b"[1, 2]", "body"), (b'"text"', "body"), (b"null", "body"),
                        (b'{"input": "a", "dimensions": "8"}', "dimensions"),
                        (b'{"input": "a", "encoding_format": "hex"}', "encoding_format"),
                        (b'{"input": "a", "normalize": "yes"}', "normalize"),
                        (b'{"input": ["a", {"b": 1}]}', "input[1]"),
                        (b'{"input": [[1, 2], [3, "4"]]}', "input[1][1]"),
                        (b'{"model": "x"}', "input")]:
        r = _post(client, body)
        assert r.status_code == 422, body
        error = r.json()["error"]
        assert error["param"] == param, (body, error)
        assert error["type"] == "invalid_request_error" and error["message"]


WEIRD_BODIES = [b"{}", b"[]", b"0", b"true", b'{"input": null}', b'{"input": {}}', b'{"input": [[]]}',
                b'{"input": [null]}', b'{"input": [1e400]}', b'{"input": [[1, 2.0]]}', b'{"input": "\\u0000"}',
                b'{"query": 5, "documents": "x"}', b'{"query": "q", "documents": [{"text": 3}]}',
                b'{"text_1": [], "text_2": "x"}', b'{"input": [["a"]], "dimensions": 99999999999999999999}',
                b'{"input": "a", "top_n": -1, "dimensions": -1}', b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                b'{"input": ["a"], "model": ["x"]}', b'{"input": "a", "input_type": 3, "prompt_name": []}']


def test_no_bad_body_gets_a_500(client) -> None:
    """RELIABILITY 9: whatever the body, no route answers 5xx; errors carry the OpenAI error body."""
    for route in ("/v1/embeddings", "/v1/contextualizedembeddings", "/v1/score", "/v1/rerank"):
        for body in WEIRD_BODIES:
            r = _post_to(client, route, body)
            assert r.status_code < 500, (route, body[:60], r.status_code, r.text)
            if r.status_code != 200:  # a NUL character is a valid (if odd) text
                assert r.status_code >= 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def _post_to(client, route, content):
    return client.post(route, content=content, headers={"Content-Type": "application/json"})

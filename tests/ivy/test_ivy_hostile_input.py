"""A hostile client's headers and names (issue 15): RELIABILITY cases 33, 34 and 35."""

from __future__ import annotations

import pytest

from ivy_testkit import gateway, model_copy

MARKER = "MARKER-7f3a"


@pytest.mark.parametrize("value", ["-1", "0", "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "soon"])
def test_bad_request_timeout_is_422_naming_the_header_and_range(fake, client, value) -> None:
    """RELIABILITY 33: a negative, zero, NaN or infinite X-Request-Timeout is a 422, never a 504."""
    r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": value})
    assert r.status_code == 422, (value, r.text)
    error = r.json()["error"]
    assert error["param"] == "x-request-timeout" and error["code"] == "invalid_parameter"
    assert "X-Request-Timeout" in error["message"] and "greater than 0" in error["message"]
    assert fake.calls == []


def test_good_request_timeouts_still_serve(client) -> None:
    for value in ("0.5", "30", "1e6", " 2 "):  # over the server's own timeout: the server's applies
        r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": value})
        assert r.status_code == 200, value


DOCS = ("/docs", "/redoc", "/openapi.json")


def test_docs_need_the_key_when_one_is_set(fake) -> None:
    """RELIABILITY 34: with IVY_API_KEY set, /docs, /redoc and /openapi.json answer 401 without it."""
    with gateway(fake, api_key="k-123") as client:
        for path in DOCS:
            r = client.get(path)
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert client.get(path, headers={"Authorization": "Bearer k-123"}).status_code == 200, path
        schema = client.get("/openapi.json", headers={"Authorization": "Bearer k-123"}).json()
        assert "/v1/embeddings" in schema["paths"] and "/openapi.json" not in schema["paths"]
        assert client.get("/health").status_code == 200


def test_docs_need_a_key_when_only_keys_with_lanes_are_set(fake) -> None:
    """RELIABILITY 34: IVY_API_KEY_LANES alone also turns auth on, docs included."""
    with gateway(fake, api_key_lanes=("bulk-key=bulk",)) as client:
        for path in DOCS:
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"Authorization": "Bearer bulk-key"}).status_code == 200, path


@pytest.mark.parametrize("docs, key, status", [("auto", "", 200), ("on", "k", 200), ("off", "", 404),
                                               ("off", "k", 404)])
def test_docs_flag(fake, docs, key, status) -> None:
    """RELIABILITY 34: IVY_DOCS=auto (open without a key, keyed with one), on (always open), off (none)."""
    with gateway(fake, api_key=key, docs=docs) as client:
        for path in DOCS:
            assert client.get(path).status_code == status, path


def test_error_messages_never_echo_request_text(tmp_path, fake) -> None:
    """RELIABILITY 35: errors name the field and the allowed values or limit, never the client's text."""
    folder = model_copy(tmp_path, "prompted", st_config={"prompts": {"query": "query: "}})
    with gateway(fake, model=str(folder)) as client:
        answers = [
            client.post("/v1/embeddings", json={"input": "a", "model": MARKER}),
            client.post("/v1/embeddings", json={"input": "a", "prompt_name": MARKER}),
            client.post("/v1/embeddings", json={"input": "a", f"dimensions{MARKER[:2]}": 3}),
            client.post("/v1/embeddings", content=b"x", headers={"Content-Encoding": MARKER}),
            client.get(f"/v1/models/{MARKER}"),
            client.get(f"/no/such/{MARKER}"),
            client.delete(f"/v1/embeddings?{MARKER}"),
            client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": MARKER}),
        ]
    assert [r.status_code for r in answers] == [404, 422, 422, 415, 404, 404, 405, 422]
    for r in answers:
        assert MARKER not in r.text and MARKER[:6] not in r.text, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "prompted" in answers[0].json()["error"]["message"]  # names what is served
    assert "query" in answers[1].json()["error"]["message"]  # and the allowed prompt names
    assert answers[2].json()["error"]["param"] == "dimensions"
    assert "gzip" in answers[3].json()["error"]["message"]


@pytest.mark.parametrize("route, field", [("/v1/embeddings", "input"), ("/embed", "inputs")])
def test_errors_in_one_flat_list_of_token_ids_name_its_element(fake, client, route, field) -> None:
    """RELIABILITY 9 and 35: a single sequence of ids ([5, 99999]) was named as if nested (input[0][1], an
    element that does not exist); now input[1], and `input` for its length. Nested lists keep input[i][j]."""
    cases = [([5, 99999], f"{field}[1]", "invalid_parameter"), ([5, -1, 7], f"{field}[1]", "invalid_parameter"),
             ([101] * 300, field, "input_too_long"), ([[5], [6, 99999]], f"{field}[1][1]", "invalid_parameter")]
    for ids, param, code in cases:
        r = client.post(route, json={field: ids})
        assert r.status_code == 422, (ids[:3], r.text)
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (param, code), (ids[:3], error)
        assert error["message"].startswith(f"{param} "), error["message"]
    assert fake.calls == []

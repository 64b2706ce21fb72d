"""The error table in practice: RELIABILITY cases 1, 2, 10, 11, 12, 22, overload, deadlines, replica failures, logs."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest

from ivy_testkit import gateway
from fake_tulip import FakeTulip, wait_until
from ivy.errors import PROBLEMS, IvyError, from_grpc

INFERENCE_ROUTES = {
    "/v1/embeddings": {"input": ["hello"]},
    "/v1/contextualizedembeddings": {"input": [["hello", "world"]]},
    "/v1/score": {"text_1": "a", "text_2": ["b"]},
    "/v1/rerank": {"query": "a", "documents": ["b"]},
    "/tokenize": {"prompt": "hello"},
    "/embed": {"inputs": "hello"},
    "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
    "/decode": {"ids": [101, 102]},
    "/detokenize": {"tokens": [101, 102]},
    "/pooling": {"input": "hello"},
}


def test_every_problem_has_a_status_and_openai_body() -> None:
    for problem, (status, kind) in PROBLEMS.items():
        r = IvyError(problem, "msg", param="p").to_response()
        assert r.status_code == status and 400 <= status < 600
        assert kind.endswith("_error")
    too_big = "Received message larger than max (5 vs. 4)"
    assert from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, too_big, "r").status == 413
    assert from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "", "r", reason="response_too_large").status == 413
    assert from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full: 300000 tokens waiting", "r").status == 429
    assert from_grpc(grpc.StatusCode.DEADLINE_EXCEEDED, "", "r").status == 504
    assert from_grpc(grpc.StatusCode.UNAVAILABLE, "", "r").status == 503
    assert from_grpc(grpc.StatusCode.CANCELLED, "", "r").status == 503  # the replica dropped it, not the client
    assert from_grpc(grpc.StatusCode.INTERNAL, "boom", "r").status == 502


def test_empty_input_is_400_and_reaches_no_replica(fake, client) -> None:
    """RELIABILITY 1 and 2."""
    r = client.post("/v1/embeddings", json={"input": []})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "input must not be empty", "type": "invalid_request_error",
                                  "param": "input", "code": "empty_input"}}
    r = client.post("/v1/embeddings", json={"input": ["a", ""]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]" and "input[1]" in r.text
    r = client.post("/v1/contextualizedembeddings", json={"input": [["a", ""]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0][1]"
    assert fake.calls == []


def test_unknown_model_is_404(client) -> None:
    """RELIABILITY 10."""
    for route, body in INFERENCE_ROUTES.items():
        r = client.post(route, json={**body, "model": "gpt-9"})
        assert r.status_code == 404, route
        assert r.json()["error"]["message"].startswith("the requested model is not served here")
        assert "gpt-9" not in r.text  # RELIABILITY 35
        assert r.json()["error"]["code"] == "model_not_found"
    assert client.post("/v1/embeddings", json={"input": "a", "model": "all-MiniLM-L6-v2"}).status_code == 200


def test_bearer_auth_on_every_inference_route_health_stays_open(fake) -> None:
    """RELIABILITY 11."""
    with gateway(fake, api_key="s3cret-key") as client:
        for route, body in INFERENCE_ROUTES.items():
            assert client.post(route, json=body).status_code == 401, route
            assert client.post(route, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert client.post(route, json=body, headers={"Authorization": "Basic s3cret-key"}).status_code == 401
            ok = client.post(route, json=body, headers={"Authorization": "Bearer s3cret-key"})
            assert ok.status_code == 200, (route, ok.text)
        r = client.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer" and "s3cret" not in r.text
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        for path in ("/health", "/ready", "/metrics"):
            assert client.get(path).status_code == 200, path


def test_the_api_key_help_names_exactly_the_routes_left_open(fake) -> None:
    """Review: --api-key's help said "every /v1 route"; every route of the app but /health, /ready and /metrics
    needs it (GET /info, /v1/models, /docs and /openapi.json included), and the help now says so."""
    import dataclasses

    from starlette.routing import Route

    from ivy.config import IvyConfig

    text = next(f for f in dataclasses.fields(IvyConfig) if f.name == "api_key").metadata["help"]
    assert "/v1 route" not in text
    assert all(path in text for path in ("/health, /ready and /metrics", "POST route", "/info", "/v1/models",
                                         "/docs", "/openapi.json")), text
    open_paths = set()
    with gateway(fake, api_key="s3cret-key") as client:
        paths = {r.path.replace("{model:path}", "x"): r.methods for r in client.app.routes if isinstance(r, Route)}
        assert {"/docs", "/openapi.json", "/info", "/v1/models", "/v1/embeddings"} <= set(paths)
        for path, methods in paths.items():
            method = "POST" if "POST" in methods else "GET"
            if client.request(method, path, json={}).status_code != 401:
                open_paths.add(path)
    assert open_paths == {"/health", "/ready", "/metrics"}


def test_a_known_route_with_a_trailing_slash_is_the_route_and_nothing_redirects(fake) -> None:
    """Review: /v1/embeddings/ (and /health/) answered a bare 307 with an empty body and an http:// Location (wrong
    behind a TLS proxy). Now a known route's path with one trailing slash is served as the route (the hot path's
    POSTs and the stack's routes alike, CORS on or off), any other path gets the OpenAI-shaped 404."""
    from ivy.metrics import KNOWN_ROUTES

    for cors in ((), ("https://a.example",)):
        with gateway(fake, cors_origins=cors) as client:
            plain = client.post("/v1/embeddings", json={"input": ["hello"]})
            slashed = client.post("/v1/embeddings/", json={"input": ["hello"]}, follow_redirects=False)
            assert slashed.status_code == 200 and slashed.json() == plain.json(), slashed.text
            embed = client.post("/embed/", json={"inputs": "hello"}, follow_redirects=False)
            assert embed.status_code == 200 and embed.json() == client.post("/embed", json={"inputs": "hello"}).json()
            for path in ("/health/", "/ready/", "/metrics/", "/v1/models/", "/info/"):
                r = client.get(path, follow_redirects=False)
                assert r.status_code == 200, (path, r.status_code, r.text)
            assert client.get("/health/").json() == {"status": "ok"}
            for path in ("/nope/", "/nope", "/v1/embeddings//", "/v1/nope/"):
                r = client.post(path, json={"input": "a"}, follow_redirects=False)
                assert r.status_code == 404, (path, r.status_code)
                assert r.json() == {"error": {"message": "no route at this path", "type": "invalid_request_error",
                                              "param": None, "code": "not_found"}}, (path, r.text)
            wrong = client.get("/v1/embeddings/", follow_redirects=False)
            assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
            for route in sorted(KNOWN_ROUTES) + ["/docs", "/redoc", "/openapi.json", "/v1/models/x", "/nope"]:
                for path in {route, route.rstrip("/") + "/", route + "//"}:
                    for method in ("GET", "POST"):
                        r = client.request(method, path, follow_redirects=False)
                        assert not 300 <= r.status_code < 400 and "location" not in r.headers, (method, path)


def test_cors_closed_by_default_and_open_to_configured_origins(fake) -> None:
    """RELIABILITY 12."""
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    with gateway(fake) as client:
        r = client.post("/v1/embeddings", json={"input": "a"}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-origin" not in client.options("/v1/embeddings", headers=preflight).headers
    with gateway(fake, cors_origins=("https://good.example",)) as client:
        good = client.post("/v1/embeddings", json={"input": "a"}, headers={"Origin": "https://good.example"})
        assert good.headers["access-control-allow-origin"] == "https://good.example"
        evil = client.post("/v1/embeddings", json={"input": "a"}, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in evil.headers
        # a browser SDK's preflight names its own headers (openai-node: x-stainless-*); scripts read these two
        sdk = client.options("/v1/embeddings", headers={
            "Origin": "https://good.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-stainless-retry-count"})
        assert sdk.status_code == 200, sdk.text
        assert set(good.headers["access-control-expose-headers"].lower().split(", ")) >= {"retry-after",
                                                                                           "x-request-id"}


def test_request_id_echoed_generated_and_sent_to_the_replica(fake, client) -> None:
    given = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Id": "trace-42.abc"})
    assert given.headers["x-request-id"] == "trace-42.abc" and fake.calls[-1].request_id == "trace-42.abc"
    fresh = client.post("/v1/embeddings", json={"input": "a"})
    rid = fresh.headers["x-request-id"]
    assert len(rid) == 32 and fake.calls[-1].request_id == rid
    assert client.post("/v1/embeddings", json={"input": "a"}).headers["x-request-id"] != rid
    odd = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Id": "no spaces <allowed>"})
    assert odd.headers["x-request-id"] != "no spaces <allowed>" and len(odd.headers["x-request-id"]) == 32
    failed = client.post("/v1/embeddings", json={"input": []})
    assert failed.status_code == 400 and len(failed.headers["x-request-id"]) == 32


def test_retrieve_one_model_and_405_names_allowed_methods(client) -> None:
    name = client.get("/v1/models").json()["data"][0]["id"]
    card = client.get(f"/v1/models/{name}")
    assert card.status_code == 200 and card.json()["id"] == name and card.json()["object"] == "model"
    assert client.get("/v1/models/all-MiniLM-L6-v2").status_code == 200  # the short name bodies accept too
    missing = client.get("/v1/models/not-this-one")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    wrong = client.get("/v1/embeddings")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]


def test_concurrency_cap_429_with_retry_after(fake) -> None:
    fake.gate = threading.Event()
    with gateway(fake, max_concurrent_requests=1) as client:
        results = {}
        first = threading.Thread(target=lambda: results.update(a=client.post("/v1/embeddings", json={"input": "a"})))
        first.start()
        wait_until(lambda: fake.waiting == 1)
        second = client.post("/v1/embeddings", json={"input": "b"})
        fake.gate.set()
        first.join(timeout=10)
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "overloaded"
    assert results["a"].status_code == 200


def test_deadline_becomes_grpc_timeout_504(fake) -> None:
    fake.gate = threading.Event()
    with gateway(fake) as client:
        r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": "0.2"})
        fake.gate.set()
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
        assert client.post("/v1/embeddings", json={"input": "a"}).status_code == 200  # the next call is fine
        assert client.post("/v1/embeddings", json={"input": "a"},
                           headers={"X-Request-Timeout": "soon"}).status_code == 422


def test_no_reachable_replica_503_fast_and_not_ready() -> None:
    with FakeTulip() as fake:
        address = fake.address
    with _gateway_at(address) as client:
        start = time.monotonic()
        r = client.post("/v1/embeddings", json={"input": "a"})
        assert r.status_code == 503 and "retry-after" in r.headers
        assert time.monotonic() - start < 10  # answered, not hung until the 30 s deadline
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["replicas"][0]["state"] == "unreachable"
        assert client.get("/health").status_code == 200


def _gateway_at(address: str):
    class _Addr:
        pass

    fake = _Addr()
    fake.address = address
    return gateway(fake)


@pytest.mark.parametrize("code, details, reason, status", [
    (grpc.StatusCode.UNAVAILABLE, "replica draining", "shutting_down", 503),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue holds too many tokens", "queue_full", 429),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "out of pinned memory", "engine_overloaded", 429),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "the response would be 70 MB; the limit is 16 MB", "response_too_large", 413),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (70000000 vs. 16777216)", "", 413),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "expired in queue", "deadline_exceeded", 504),
    (grpc.StatusCode.INTERNAL, "kernel failed", "engine_failed", 502),
])
def test_replica_status_codes_map_to_http(fake, client, code, details, reason, status) -> None:
    """RELIABILITY 22 and the rest of the gRPC -> HTTP table, with a single replica (nowhere to retry)."""
    fake.fail_with, fake.fail_details, fake.fail_reason = code, details, reason
    # a full queue is retried until the deadline (RELIABILITY 31): a short one keeps the 429 rows quick, with room
    # for a stall of the loaded host (at 0.5 s a stall before the first answer turned the rows into 504s)
    r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": "2"})
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_response_over_grpc_message_limit_is_413(fake) -> None:
    """RELIABILITY 22 on Ivy's side: the reply is larger than the channel's receive limit."""
    with gateway(fake, grpc_max_message_bytes=2000) as client:
        assert client.post("/v1/embeddings", json={"input": "a", "dimensions": 8}).status_code == 200
        r = client.post("/v1/embeddings", json={"input": ["a", "b", "c"]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "message_too_large"


def test_unexpected_failure_is_a_clean_500_and_logs_no_text(client, caplog) -> None:
    leaked = "-".join(["SECRET", "TEXT", "42"])

    async def boom(*args, **kwargs):
        raise RuntimeError(leaked)

    client.app.state.gateway.embed = boom
    with caplog.at_level(logging.DEBUG):
        r = client.post("/v1/embeddings", json={"input": "SECRET-TEXT-42"})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error" and "SECRET" not in r.text
    assert "RuntimeError" in caplog.text and "SECRET-TEXT" not in caplog.text


def test_logs_never_hold_request_text_or_api_key(fake, caplog) -> None:
    """Part of RELIABILITY 24: after 4xx and 5xx answers no log line quotes the input or the key."""
    secret = "SECRET-TEXT-77"
    with caplog.at_level(logging.DEBUG), gateway(fake, api_key="KEY-99") as client:
        auth = {"Authorization": "Bearer KEY-99"}
        statuses = [client.post("/v1/embeddings", json={"input": [secret]}, headers={"Authorization": "Bearer no"}),
                    client.post("/v1/embeddings", json={"input": [secret * 2000]}, headers=auth),
                    client.post("/v1/embeddings", json={"input": [secret], "model": secret}, headers=auth)]
        fake.fail_with, fake.fail_details = grpc.StatusCode.INTERNAL, secret  # a replica echoing the input back
        statuses.append(client.post("/v1/rerank", json={"query": secret, "documents": [secret]}, headers=auth))
        fake.fail_with = grpc.StatusCode.UNAVAILABLE
        statuses.append(client.post("/v1/embeddings", json={"input": [secret]}, headers=auth))
    assert [r.status_code for r in statuses] == [401, 422, 404, 502, 503]  # every path below really ran
    assert caplog.records, "expected some log lines"
    assert secret not in caplog.text and "KEY-99" not in caplog.text

"""The POST routes are served by plain Starlette routes (no FastAPI dependency solving per request) while
their FastAPI twins keep the OpenAPI schema complete."""

from fastapi.routing import APIRoute
from starlette.routing import Match, Route

from ivy.app import create_app
from ivy.config import IvyConfig


def _first_match(app, path: str):
    scope = {"type": "http", "path": path, "method": "POST", "root_path": ""}
    return next(r for r in app.router.routes if r.matches(scope)[0] is Match.FULL)


def test_post_routes_are_lean_and_still_documented() -> None:
    app = create_app(IvyConfig())
    for path in ("/v1/embeddings", "/embed", "/v1/contextualizedembeddings", "/v1/score", "/v1/rerank", "/tokenize"):
        route = _first_match(app, path)
        assert type(route) is Route and not isinstance(route, APIRoute), path
    paths = app.openapi()["paths"]
    assert "post" in paths["/v1/embeddings"] and "requestBody" in paths["/v1/embeddings"]["post"]
    assert "/v1/rerank" in paths and "/v1/score" in paths


def test_post_routes_are_served_ahead_of_the_middleware_stack_unless_cors_is_on() -> None:
    """The hot path (IvyApp.serve_hot): a POST route's request, its IvyError answer included, never enters
    FastAPI's middleware stack; with CORS configured every request takes the stack (preflights, headers)."""
    from starlette.testclient import TestClient

    app = create_app(IvyConfig(replicas=("127.0.0.1:1",), health_interval_s=1000))
    assert "/v1/embeddings" in app._hot and "/embed" in app._hot and "/v1/rerank" in app._hot
    assert create_app(IvyConfig(cors_origins=("https://a.example",)))._hot is None
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/health").status_code == 200  # builds the stack

        async def stack(scope, receive, send):
            raise AssertionError("the middleware stack was entered")

        app.middleware_stack = stack
        empty = client.post("/v1/embeddings", json={"input": []})
        assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_input"
        assert empty.headers["x-request-id"]  # RequestMetrics still wraps it
        assert client.post("/embed", json={"inputs": "hi", "dimensions": -1}).status_code == 422
        assert client.get("/health").status_code == 500  # everything else goes through the stack

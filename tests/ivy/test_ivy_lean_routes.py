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

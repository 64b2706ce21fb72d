"""/docs, /redoc and /openapi.json, open or behind the API key (--docs, RELIABILITY 34).

auto: FastAPI's own open pages without an API key; with one, the same three paths need the key like every
inference route (the schema lists every route and option of the deployment). on: always open. off: none.
Keyed, the Swagger and ReDoc pages load their schema from the browser without the key and show a 401: they
are for clients that send the header themselves (curl, a proxy adding it).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import Response

from ivy.config import IvyConfig
from ivy.web import gateway_of, json_response

_NONE = {"docs_url": None, "redoc_url": None, "openapi_url": None}


def _keyed(config: IvyConfig) -> bool:
    return config.docs == "auto" and bool(config.api_key or config.api_key_lanes)  # any key turns auth on


def fastapi_options(config: IvyConfig) -> dict[str, Any]:
    """FastAPI(...) arguments: its own open pages for docs=on (or auto without a key), else none."""
    return _NONE if config.docs == "off" or _keyed(config) else {}


def add_keyed_docs(app: FastAPI, config: IvyConfig) -> None:
    """With docs=auto and an API key: the three pages, each answering 401 without the key."""
    if not _keyed(config):
        return

    def authorized(request: Request) -> None:
        gateway_of(request).authorize(request.headers.get("authorization"))

    async def openapi(request: Request) -> Response:
        authorized(request)
        return json_response(app.openapi())

    async def swagger(request: Request) -> Response:
        authorized(request)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    async def redoc(request: Request) -> Response:
        authorized(request)
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    for path, endpoint in (("/openapi.json", openapi), ("/docs", swagger), ("/redoc", redoc)):
        app.add_route(path, endpoint, methods=["GET"], include_in_schema=False)

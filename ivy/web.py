"""Small HTTP helpers shared by the route modules (kept apart from app.py to avoid import cycles)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ivy.errors import IvyError, Problem
from ivy.gateway import Gateway

T = TypeVar("T")


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


def json_response(body: Any, status_code: int = 200) -> Response:
    """orjson with numpy support: float32 rows serialize without a Python float per value."""
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status_code,
                    media_type="application/json")


def request_body(*models: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a route that reads its body by hand (size caps and exact errors, see ivy.body); with
    several models, one of them (a route that takes two peers' shapes)."""
    schemas = [m.model_json_schema() for m in models]
    schema = schemas[0] if len(schemas) == 1 else {"oneOf": schemas}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was already read, so receive() only reports the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it when the client disconnects first: its gRPC calls are cancelled, so
    Tulip drops sequences it has not batched yet (RELIABILITY 16).

    The watcher cancels the work task from a done-callback: cheaper per request than asyncio.wait over
    both tasks (see benchmarks/OVERHEAD_NOTES.md)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))

    def on_disconnect(w: asyncio.Future) -> None:
        if not w.cancelled() and w.exception() is None:
            task.cancel()

    watch.add_done_callback(on_disconnect)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():  # the handler itself is being cancelled
            raise
        if watch.done() and not watch.cancelled() and watch.exception() is None:
            raise IvyError(Problem.CLIENT_CLOSED, "the client closed the connection") from None
        raise
    finally:
        watch.remove_done_callback(on_disconnect)
        for t in (task, watch):
            if not t.done():
                t.cancel()

"""The FastAPI application: routes, error handlers, CORS, metrics, and the Gateway's lifetime.

`create_app(config)` builds one app; `app_from_env()` is the factory uvicorn workers call (the config
travels to them as IVY_* environment variables). Nothing here imports torch, tulip or rose.engine.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ivy import (__version__, connections, docs, metrics, request_trace, routes_classify, routes_cohere,
                 routes_embeddings, routes_retrieval, routes_scoring, routes_tokenize)
from ivy.body import configure as configure_bodies
from ivy.config import ENV_PREFIX, IvyConfig
from ivy.errors import IvyError, Problem, from_validation_errors
from ivy.gateway import Gateway
from ivy.web import gateway_of, json_response
from ivy.responses import ModelList
from rose import gc_pauses
from rose.flags import config_from_args

log = logging.getLogger("ivy")


def create_app(config: IvyConfig) -> FastAPI:
    connections.configure(config)  # this process's socket limits (every uvicorn worker builds its app here)
    configure_bodies(config)  # and its cap on the bodies being read
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        gateway = Gateway(config)
        await gateway.start()
        app.state.gateway = gateway
        _drain_on_sigterm(gateway, config.drain_delay_s)
        log.info("ivy serving %s; replicas: %s", gateway.model_name,
                 ", ".join(f"{r['address']} ({r['state']})" for r in gateway.pool.describe()))
        pauses, frozen = None, False
        try:
            GC_TIMER.install()
            if config.gc_freeze:  # the started worker's heap out of every later collection (rose/gc_pauses.py)
                gc_pauses.freeze()
                frozen = True
            pauses = asyncio.ensure_future(_drain_gc_pauses())
            yield
        finally:
            if pauses is not None:
                pauses.cancel()
                await asyncio.gather(pauses, return_exceptions=True)
            GC_TIMER.remove()
            if frozen:
                gc_pauses.unfreeze()
            await gateway.close()

    # redirect_slashes off: Starlette's answer to /v1/embeddings/ was a bare 307 to an http:// Location (wrong
    # behind a TLS proxy, an empty body to `curl -s`); IvyApp serves a known route's path with one trailing slash
    # as the route, and any other path gets the OpenAI-shaped 404.
    app = IvyApp(title="Ivy", version=__version__, lifespan=lifespan, redirect_slashes=False,
                  description="HTTP gateway of the Ivy -> Tulip -> ROSE embedding stack.",
                  **docs.fastapi_options(config))
    routers = (routes_embeddings.router, routes_scoring.router, routes_tokenize.router, routes_retrieval.router,
               routes_classify.router, routes_cohere.router)
    for router in routers:
        app.include_router(router)
    _add_ops_routes(app)
    docs.add_keyed_docs(app, config)
    _serve_lean(app, routers)
    _add_error_handlers(app)
    if config.cors_origins:
        # Any request header: SDKs send their own (openai-node's x-stainless-*), and a preflight naming one
        # that is not allowed fails the whole browser request. Retry-After and X-Request-Id readable by scripts.
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["Retry-After", "X-Request-Id"])
    app.add_middleware(request_trace.RequestMetrics)
    if not config.cors_origins:  # CORS answers preflights and adds headers: its requests take the full stack
        app.serve_hot(routers)
    return app


class IvyApp(FastAPI):
    """FastAPI, with the POST routes served ahead of its middleware stack when `serve_hot` was called.

    Every POST route reads its own body and raises only IvyError (ivy.body, ivy.errors), so on its path the
    stack does nothing but cost: Starlette's error middleware, FastAPI's telemetry and body-limit layers,
    the exception middleware, the exit stack, the router's match and the endpoint wrapper (~90 µs of the
    ~340 µs the app spends on a request on this project's CPU; benchmarks/NOTES.md, "The hot routes ahead of
    the stack"). Here such a request gets RequestMetrics (request id, counters, the last-resort 500), the
    endpoint, and the app's own IvyError handler; every other request goes through FastAPI as before."""

    _hot: dict[str, Callable] | None = None

    def serve_hot(self, routers) -> None:
        """POST at exactly these paths (no path parameters) skips the stack; under a root_path it does not."""
        self._hot = {r.path: r.endpoint for r in _post_routes(routers) if "{" not in r.path}
        self._hot_app = request_trace.RequestMetrics(self._serve_hot)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            if scope["path"] in _SLASHED:  # the one check a request pays: a set lookup (the path's hash is reused)
                _strip_slash(scope)
            hot = self._hot
            if hot is not None and scope["method"] == "POST" and scope["path"] in hot and not scope.get("root_path"):
                scope["app"] = self  # request.app, as Starlette sets it
                await self._hot_app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve_hot(self, scope, receive, send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self._hot[scope["path"]](request)
        except IvyError as exc:
            response = await ivy_error(request, exc)
        await response(scope, receive, send)


# A known route's path with one trailing slash (/v1/embeddings/, /health/) is served as the route itself, before
# routing and before RequestMetrics reads the path; "/" has no such twin ("//" stays unknown).
_SLASHED = frozenset(route + "/" for route in metrics.KNOWN_ROUTES if route != "/")


def _strip_slash(scope) -> None:
    scope["path"] = scope["path"][:-1]
    raw = scope.get("raw_path")
    if raw and raw.endswith(b"/"):
        scope["raw_path"] = raw[:-1]


async def ivy_error(request: Request, exc: IvyError) -> Response:
    """The answer to an IvyError, wherever it was raised (the app's handler and the hot routes)."""
    if exc.status >= 500:
        log.warning("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.problem.value)
    return exc.to_response()


def _serve_lean(app: FastAPI, routers) -> None:
    """Every POST route (they all take the bare Request and read their body themselves, see ivy.body) is
    served by a plain Starlette Route put ahead of its FastAPI twin, which stays for the OpenAPI schema and
    /docs. FastAPI's per-request dependency solving and endpoint wrapping cost ~110 µs a request on this
    project's CPU for nothing these routes use (benchmarks/NOTES.md, "the gateway's own cost"); error
    handlers, middleware and app.state are the app's and apply the same."""
    lean = [Route(r.path, r.endpoint, methods=["POST"], name=r.name, include_in_schema=False)
            for r in _post_routes(routers)]
    app.router.routes[0:0] = lean


def _post_routes(routers) -> list[APIRoute]:
    """The routers' POST routes: they take the bare Request and read their body themselves (ivy.body)."""
    return [r for router in routers for r in router.routes if isinstance(r, APIRoute) and r.methods == {"POST"}]


GC_TIMER = gc_pauses.PauseTimer(metrics.observe_gc_pause, deferred=True)  # one per worker process


async def _drain_gc_pauses(every_s: float = 1.0) -> None:
    """The collector's pauses into ivy_gc_pause_seconds every `every_s` (and at each scrape) while the worker
    serves. Deferred: in multiprocess mode a metric's value takes the process's one metrics lock, which a
    collection can interrupt while it is held (an observation from the collection would wait on it forever)."""
    while True:
        await asyncio.sleep(every_s)
        GC_TIMER.drain()


def app_from_env() -> FastAPI:
    """uvicorn factory in each worker process: the config from IVY_* environment variables (set by `ivy serve`),
    and the worker's logging (a worker starts as a new interpreter: without it only warnings reached stderr,
    unformatted)."""
    from ivy.cli import setup_logging

    config = config_from_args(IvyConfig, {}, ENV_PREFIX)
    setup_logging(config)
    return create_app(config)


def _add_ops_routes(app: FastAPI) -> None:
    @app.get("/v1/models", response_model=ModelList)
    async def list_models(request: Request) -> Response:
        gw = gateway_of(request)
        gw.authorize(request.headers.get("authorization"))
        return json_response({"object": "list", "data": [_model_card(gw)]})

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str, request: Request) -> Response:
        gw = gateway_of(request)
        gw.authorize(request.headers.get("authorization"))
        if model not in gw.model_names:  # the served name, or any name a request body may use
            raise IvyError(Problem.MODEL_NOT_FOUND, "the requested model is not served here; this gateway serves "
                           f"{gw.model_name!r}", param="model")
        return json_response(_model_card(gw))

    @app.get("/info")
    async def info(request: Request) -> Response:
        """text-embeddings-inference's model and limits (its clients read max_client_batch_size and
        max_input_length to size their requests)."""
        gw = gateway_of(request)
        gw.authorize(request.headers.get("authorization"))
        return json_response(_tei_info(gw))

    @app.get("/health")
    async def health() -> Response:
        """Alive: 200 as soon as the process serves HTTP, whatever the replicas do."""
        return json_response({"status": "ok"})

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        """200 while any replica is SERVING the model and tokenizer Ivy tokenizes for (RELIABILITY 29: one
        Tulip down must not take every gateway out of the Service); "degraded" while some replica is not;
        503 when none serves, or on SIGTERM (draining)."""
        gw = gateway_of(request)
        await gw.pool.refresh()
        ok = gw.pool.ready() and not gw.draining
        degraded = ok and gw.pool.degraded()
        status = "draining" if gw.draining else "degraded" if degraded else "ready" if ok else "not_ready"
        body = {"status": status, "degraded": degraded, "model": gw.model_name,
                "replicas_serving": gw.pool.serving(), "replicas": gw.pool.describe()}
        return json_response(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        GC_TIMER.drain()
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)


def _drain_on_sigterm(gateway: Gateway, delay_s: float) -> None:
    """RELIABILITY 20: on SIGTERM /ready answers 503 at once, requests are still served for `delay_s` (load
    balancers and Kubernetes endpoints stop routing here meanwhile), then uvicorn's own handler stops
    accepting and finishes what is in flight. A second SIGTERM skips the rest of the delay (in-flight
    requests still finish). Wraps uvicorn's handler, so it only works where that was installed: the main
    thread of a server process."""
    if threading.current_thread() is not threading.main_thread():
        return
    uvicorn_handler = signal.getsignal(signal.SIGTERM)
    if not callable(uvicorn_handler):
        return
    loop = asyncio.get_running_loop()

    def on_sigterm(sig: int, frame) -> None:
        if gateway.draining or delay_s <= 0:
            gateway.draining = True
            uvicorn_handler(sig, frame)
            return
        gateway.draining = True
        log.info("SIGTERM: /ready is 503; still serving for %.1f s, then stopping", delay_s)
        loop.call_soon_threadsafe(loop.call_later, delay_s, uvicorn_handler, sig, None)

    signal.signal(signal.SIGTERM, on_sigterm)


def _tei_info(gw: Gateway) -> dict:
    """text-embeddings-inference's GET /info, from what this gateway and its replicas know. model_type: a
    reranker's {"reranker": labels}, a classifier's {"classifier": its labels}, else {"embedding": {"pooling"}}
    (TEI's names: cls, mean, last_token, splade); model_id and served_model_name: the name requests use (TEI's
    model_id is the hub id); model_dtype: the
    dtype the replicas' rows come in (Tulip's native_dtype: float32 or int8), not their compute dtype;
    max_batch_tokens: the replicas' batch budget (Tulip's Info), else the chunk size Ivy sends;
    max_client_batch_size: the inputs one request may hold."""
    spec, config = gw.spec, gw.config
    if "rerank" in spec.tasks:
        label = routes_classify.RERANKER_LABEL
        model_type = {"reranker": {"id2label": {"0": label}, "label2id": {label: 0}}}
    elif "classify" in spec.tasks:
        labels = spec.score_head.labels
        model_type = {"classifier": {"id2label": {str(i): label for i, label in enumerate(labels)},
                                     "label2id": {label: i for i, label in enumerate(labels)}}}
    else:
        sparse_only = spec.tasks == ("sparse",)
        pooling = {"last": "last_token"}.get(spec.pooling, spec.pooling)  # TEI's name for it
        model_type = {"embedding": {"pooling": "splade" if sparse_only else pooling}}
    infos = [r.info for r in gw.pool.replicas if r.info is not None]
    budgets = [i.max_batch_tokens for i in infos if i.max_batch_tokens]
    dtype = next((i.native_dtype for i in infos if i.native_dtype), "float32")
    return {"model_id": gw.model_name, "served_model_name": gw.model_name, "model_sha": None, "model_dtype": dtype,
            "model_type": model_type,
            "max_concurrent_requests": config.max_concurrent_requests, "max_input_length": spec.max_length,
            "max_batch_tokens": min(budgets) if budgets else config.chunk_max_tokens, "max_batch_requests": None,
            "max_client_batch_size": config.max_inputs_per_request, "auto_truncate": config.truncate,
            "tokenization_workers": config.tokenizer_thread_count(), "version": __version__, "sha": None,
            "docker_label": None}


def _model_card(gw: Gateway) -> dict:
    return {"id": gw.model_name, "object": "model", "created": gw.created, "owned_by": "ivy",
            "max_model_len": gw.spec.max_length, "dimensions": gw.spec.dimensions, "tasks": list(gw.spec.tasks)}


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(IvyError, ivy_error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return from_validation_errors(exc.errors()).to_response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        problem = {404: Problem.NOT_FOUND, 405: Problem.METHOD_NOT_ALLOWED}.get(exc.status_code, Problem.INVALID_JSON)
        allow = (exc.headers or {}).get("Allow")  # messages name the route's rules, never the client's path
        message = {404: "no route at this path", 405: f"this method is not allowed here (allowed: {allow or 'none'})"}
        response = IvyError(problem, message.get(exc.status_code, str(exc.detail))).to_response()
        response.headers.update(exc.headers or {})  # 405's Allow
        return response

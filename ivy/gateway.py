"""The gateway's runtime state and its one inference path, shared by every route (no HTTP in here).

`Gateway.embed` takes already-tokenized sequences (and optional late-chunking spans), splits them into
chunks by token budget and sequence count (ivy.chunking), sends the chunks concurrently through the
ReplicaPool, and reassembles the rows in input order. Admission (the concurrency cap), auth, model-name
checks and the request deadline live here too so that every route applies them the same way.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ivy import metrics, request_trace
from ivy.body import M, read_model
from ivy.chunking import plan_chunks
from ivy.client_slots import CLIENT, ClientSlots, client_of
from ivy.coalesce import Coalescer
from ivy.config import IvyConfig
from ivy.encode import checked_rows, embed_request
from ivy.errors import IvyError, Problem
from ivy.inputs import ItemLimits, item_limits, too_many
from ivy.lanes import lane_value, parse_key_lanes, resolve
from ivy.replicas import Expected, ReplicaPool
from ivy.token_texts import TokenTexts
from ivy.tokenization import InputEncoder, request_deadline
from rose.head import Encoding
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer


def bearer_token(authorization: str | None) -> str | None:
    """The token of an Authorization header of the Bearer scheme (any case, spaces around it dropped); else None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class Gateway:
    def __init__(self, config: IvyConfig) -> None:
        self.config = config
        self._item_limits = ItemLimits(config.max_inputs_per_request, config.max_chunks_per_request)
        threads = config.tokenizer_thread_count()
        # `tokenizers` spreads a call of several texts over rayon's pool, by default one thread per core of the
        # host: in a container limited to a few CPUs that is dozens of threads throttled by the quota. Sized
        # like this worker's own tokenizer threads before the pool's first use, unless the operator set it.
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        model_dir = Path(config.model) if config.model else bundled_model_dir()
        self.spec = load_spec(model_dir)
        self.tokenizer = Tokenizer(self.spec, cache_words=config.tokenizer_cache_words,
                                   bpe_whole_chars=config.tokenizer_bpe_whole_chars,
                                   cache_call_chars=config.tokenizer_cache_call_chars)
        if self.tokenizer.word_cache is not None:
            self.tokenizer.word_cache.observe = metrics.observe_words
        self.model_name = config.served_model_name or self.spec.model_id
        # Accepted `model` values: the served name, the model id, and the id without its hub owner.
        self.model_names = {self.model_name, self.spec.model_id, self.spec.model_id.rsplit("/", 1)[-1]}
        self.encoder = InputEncoder(
            self.spec, self.tokenizer, threads=threads,
            char_cap=config.char_cap(self.spec.max_length), query_prefix=config.query_prefix,
            document_prefix=config.document_prefix, observe=request_trace.observe_tokenize,
            inline_chars=config.tokenize_inline_chars, warm_inline=config.tokenize_warm_inline,
            split_chars=config.tokenize_split_chars,
            piece_chars=config.tokenize_piece_chars)
        self.token_texts = TokenTexts(self.encoder)  # /tokenize, /decode, texts cut to k tokens
        expected = Expected(model_ids=frozenset(self.model_names), fingerprint=self.tokenizer.fingerprint,
                            dimensions=self.spec.dimensions, max_length=self.spec.max_length, tasks=self.spec.tasks)
        self.pool = ReplicaPool(config.replica_entries(), expected, health_interval_s=config.health_interval_s,
                                max_message_bytes=config.grpc_max_message_bytes, stream=config.grpc_stream,
                                framed=config.framed, attempt_timeout_s=config.replica_timeout_s)
        self.coalescer = (Coalescer(self.pool.call, config.chunk_max_tokens, config.chunk_max_seqs)
                          if config.coalesce else None)
        self.key_lanes = parse_key_lanes(config.api_key_lanes)  # more accepted keys, each with its lane
        self.keyed = bool(config.api_key or self.key_lanes)  # a client is its key (ivy.client_slots)
        self.max_in_flight = config.per_worker_concurrency()
        self.in_flight = 0
        self.client_slots = ClientSlots(self.max_in_flight, config.client_share)  # one client's share of them
        self.draining = False  # SIGTERM seen: /ready is 503 (ivy.app._drain_on_sigterm)
        self.created = int(time.time())

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()
        self.encoder.close()

    # ---- per-request checks ----

    async def read_request(self, request, schema: type[M]) -> tuple[M, float]:
        """(body, deadline): the request's deadline, its body read within the size and time limits and
        validated against `schema`, and the model it names checked. Call before admit(): the cap bounds work
        (tokenizing, replicas), and a client trickling its body must not hold a slot (RELIABILITY 19);
        the body's own limits are its size cap and --body-read-timeout-s."""
        deadline = self.deadline(request.headers.get("x-request-timeout"))
        request_deadline.set(deadline)  # the tokenizer threads' wait is held to it (ivy.tokenization)
        item_limits.set(self._item_limits)  # lists counted before their items are checked (ivy.inputs)
        self.refuse_if_full()
        body = await read_model(request, schema, self.config.payload_limit_bytes, self.config.body_read_timeout_s)
        self.check_model(body.model)
        return body, deadline

    async def open_request(self, request, schema: type[M], task: str | None = None,
                           route: str = "") -> tuple[M, float, str | None]:
        """(body, deadline, lane): every POST route's prologue (the tokenizer's too). Auth first (a 401 before any body is
        read), then read_request (before admit()), the model's `task` for `route` when given, and the lane
        the request asks for (lane_for; None for a body without `priority`: a route that reaches no replica,
        where X-Priority means nothing)."""
        token = bearer_token(request.headers.get("authorization")) if self.keyed else None
        key_lane = self.key_lane(token)
        CLIENT.set(client_of(token, request.scope))
        body, deadline = await self.read_request(request, schema)
        if task is not None:
            self.require_task(task, route)
        if "priority" not in type(body).model_fields:
            return body, deadline, None
        return body, deadline, self.lane_for(request.headers.get("x-priority"), body.priority, key_lane)

    def authorize(self, authorization: str | None) -> str | None:
        """Bearer auth of an Authorization header: key_lane of its token."""
        return self.key_lane(bearer_token(authorization))

    def key_lane(self, token: str | None) -> str | None:
        """Bearer auth with constant-time compares; the key is never logged or echoed. Accepted: --api-key
        and every key of --api-key-lanes; returns the lane of the key used (None: no default lane)."""
        key = self.config.api_key
        if not key and not self.key_lanes:
            return None
        if token is not None:
            given = token.encode()
            lane = None
            for known, known_lane in self.key_lanes.items():  # every key compared: no early exit on a match
                if hmac.compare_digest(given, known.encode()):
                    lane = known_lane
            if lane is not None:
                return lane
            if key and hmac.compare_digest(given, key.encode()):
                return None
        raise IvyError(Problem.UNAUTHORIZED, "missing or invalid API key; send Authorization: Bearer <key>")

    def lane_for(self, header: str | None, body: str | None = None, key_lane: str | None = None) -> str | None:
        """The lane asked for (ivy/lanes.py: body, then X-Priority, then the key's); None = by size in embed()."""
        return resolve(body, header, key_lane)

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise IvyError(Problem.MODEL_NOT_FOUND, "the requested model is not served here; this server serves "
                           f"{self.model_name!r}", param="model")  # never the client's text (ivy.errors)

    @property
    def cross_encoder(self) -> bool:
        """The served model is a reranker: /v1/score and /v1/rerank cross-encode pairs (ivy.cross_encode). A
        classifier has a score head too, but labels, not a relevance score: it does not score."""
        return "rerank" in self.spec.tasks

    def require_task(self, task: str, route: str) -> None:
        """400 naming the model's tasks when `route` needs one it does not do (/v1/embeddings on a reranker)."""
        if task not in self.spec.tasks:
            raise IvyError(Problem.UNSUPPORTED_TASK, f"{route} needs a model that does {task!r}; {self.model_name!r} "
                           f"does {', '.join(repr(t) for t in self.spec.tasks)} (see GET /v1/models)", param="model")

    def check_count(self, n: int, limit: int, param: str = "input") -> None:
        if n > limit:
            raise too_many(n, limit, param)

    def check_dimensions(self, dimensions: int | None, param: str = "dimensions") -> int:
        if dimensions is None:
            return 0
        if not 1 <= dimensions <= self.spec.dimensions:
            raise IvyError(Problem.INVALID_PARAMETER, f"{param} must be between 1 and {self.spec.dimensions} "
                           f"for this model, got {dimensions}", param=param, limit=self.spec.dimensions)
        return dimensions

    def deadline(self, header: str | None) -> float:
        """Monotonic deadline: the server's request timeout, shortened by an `X-Request-Timeout` header (s).
        A header that is not a finite number above 0 (-1, 0, nan, inf) is a 422 (RELIABILITY 33); one over
        the server's timeout gets the server's."""
        timeout = self.config.request_timeout_s
        if header:
            try:
                asked = float(header)
            except ValueError:
                asked = -1.0
            if not 0 < asked < float("inf"):  # False for nan too
                raise IvyError(Problem.INVALID_PARAMETER, "X-Request-Timeout must be a finite number of seconds "
                               f"greater than 0 (the server allows at most {timeout:g})", param="x-request-timeout",
                               limit=timeout)
            timeout = min(timeout, max(0.001, asked))
        return time.monotonic() + timeout

    def chunks_in_flight(self) -> int:
        """How many chunks of one request may be on the replicas at once (RELIABILITY 31): all at once, a
        request larger than the replicas' free queues was refused (429) on an idle stack; four per serving
        replica keep each one's two batches in flight fed, with one request's backlog a small part of a queue."""
        return self.config.max_chunks_in_flight or 4 * max(1, self.pool.serving())

    def refuse_if_full(self) -> None:
        """429 with Retry-After when the concurrency cap is reached: called before reading a body (load
        shedding must cost no parsing) and again by admit() once the body is in."""
        if self.in_flight >= self.max_in_flight:
            self.client_slots.refused_as_full(CLIENT.get())
            raise IvyError(Problem.OVERLOADED, f"the server is at its limit of {self.config.max_concurrent_requests} "
                           "concurrent requests; retry later", limit=self.config.max_concurrent_requests)

    @contextmanager
    def admit(self) -> Iterator[None]:
        """The concurrency cap: over it a request is refused at once with 429 and Retry-After; so is a client that
        holds its share of the slots after another was refused as full (ivy.client_slots)."""
        self.refuse_if_full()
        client = CLIENT.get()
        self.client_slots.take(client, self.in_flight)
        self.in_flight += 1
        metrics.IN_FLIGHT.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.client_slots.give(client)
            metrics.IN_FLIGHT.dec()

    # ---- the inference path ----

    async def embed(self, sequences: Sequence[Sequence[int]], *, deadline: float, dimensions: int = 0,
                    normalize: bool | None = None, encoding: Encoding = Encoding.FLOAT32,
                    spans: Sequence[Sequence[tuple[int, int]]] | None = None, lane: str | None = None,
                    token_types: Sequence[Sequence[int]] | None = None, output: str = "") -> np.ndarray:
        """Rows for `sequences` in input order (one per sequence, or one per span of each sequence), in the
        priority `lane` (None: bulk above --bulk-above-tokens tokens, else interactive). `token_types`: one
        list per sequence (BERT cross-encoder pairs). `output`: one of the model's outputs (ivy.retrieval; a
        reranker's logit, ivy.cross_encode)."""
        lengths = [len(s) for s in sequences]
        wire_lane = lane_value(lane, sum(lengths), self.config.bulk_above_tokens)
        rows_per_seq = [len(s) for s in spans] if spans is not None else [1] * len(sequences)
        chunks = plan_chunks(lengths, rows_per_seq, self.config.chunk_max_tokens, self.config.chunk_max_seqs)
        if not await self.pool.any_serving_now(deadline):
            raise IvyError(Problem.UNAVAILABLE, "no model replica is available; retry later")
        request_id = request_trace.REQUEST_ID.get() or uuid.uuid4().hex
        if (self.coalescer is not None and spans is None and token_types is None and not output and len(chunks) == 1
                and (self.coalescer.has_open_group() or self.pool.busy())  # alone: straight out, no extra turn
                and not self.pool.all_framed()):  # framed calls are cheap: each request its own (ivy/coalesce.py)
            return await self.coalescer.embed(sequences, chunks[0].tokens, deadline=deadline, dimensions=dimensions,
                                              normalize=normalize, encoding=encoding, request_id=request_id,
                                              lane=wire_lane)
        flow = request_trace.request_flow()
        requests = [embed_request(sequences[c.first: c.first + c.count], c.tokens, dimensions=dimensions,
                                  normalize=normalize, encoding=encoding, request_id=request_id, flow=flow,
                                  lane=wire_lane,
                                  spans=None if spans is None else spans[c.first: c.first + c.count],
                                  token_types=None if token_types is None else token_types[c.first: c.first + c.count],
                                  output=output)
                    for c in chunks]
        if len(chunks) == 1:
            results = [await self.pool.call(requests[0], chunks[0].tokens, deadline)]
        else:
            calls = [lambda r=r, c=c: self.pool.call(r, c.tokens, deadline) for r, c in zip(requests, chunks)]
            results = await _gather_or_fail(calls, self.chunks_in_flight())
        for response in results:
            request_trace.note_backend(response)
        parts = [checked_rows(response, c.rows) for c, response in zip(chunks, results)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


async def _gather_or_fail(calls, limit: int) -> list:
    """Run the chunk calls concurrently, at most `limit` at a time, started in input order; on the first
    failure cancel the rest and raise that failure."""
    gate = asyncio.Semaphore(limit)

    async def bounded(call):
        async with gate:
            return await call()

    tasks = [asyncio.ensure_future(bounded(c)) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

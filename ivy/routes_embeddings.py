"""POST /v1/embeddings (OpenAI-compatible), POST /v1/contextualizedembeddings (Perplexity-compatible),
POST /embed (text-embeddings-inference's, for its clients) and POST /pooling (vLLM's pooling API, task embed).

Both follow one path: auth -> admission -> bounded body -> schema -> model/limit checks -> tokenize off the
loop -> Gateway.embed (chunks over replicas) -> encode rows. Usage counts the tokens actually sent.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy import metrics, request_trace
from ivy.embed_dtypes import value_bytes, wire_dtype
from ivy.encode import WIRE_ENCODING, default_format, row_value
from ivy.errors import IvyError, Problem
from ivy.pooling import PoolingRequest, PoolingResponse, input_truncation
from ivy.web import gateway_of, json_response, request_body, unless_disconnected, usage
from ivy.responses import ContextualizedEmbeddingsResponse, EmbeddingsResponse
from ivy.schemas import ContextualizedEmbeddingsRequest, EmbeddingsRequest, TeiEmbedRequest

router = APIRouter()
RAW_FORMATS = ("bytes", "bytes_only")  # vLLM's: no JSON, the rows' bytes (bytes_answer)


@router.post("/v1/embeddings", openapi_extra=request_body(EmbeddingsRequest),
             responses={200: {"model": EmbeddingsResponse}})
@router.post("/embeddings", openapi_extra=request_body(EmbeddingsRequest), include_in_schema=False)  # Infinity's
async def create_embeddings(request: Request) -> Response:
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, EmbeddingsRequest, "embed", "/v1/embeddings")
    truncate, max_tokens = input_truncation(gw, body)
    with gw.admit():
        fmt = body.encoding_format or default_format(gw.spec.native_int8)
        dtype = wire_dtype(fmt, body.embed_dtype, body.endianness,  # before any work: it may refuse
                           sent=body.encoding_format is not None)
        if body.late_chunking:
            rows, tokens = await _late_chunked(request, gw, body, deadline, fmt=fmt, lane=lane)
        else:
            rows, tokens = await _embed_inputs(request, body.input, deadline, route="/v1/embeddings", param="input",
                                               fmt=fmt, truncate=truncate, side=body.truncation_side,
                                               prompt=(body.input_type, body.prompt_name),
                                               dimensions=body.dimensions, normalize=body.normalize, lane=lane,
                                               max_tokens=max_tokens)
        if fmt in RAW_FORMATS:
            return bytes_answer(rows, fmt, dtype, embed_dtype=body.embed_dtype, endianness=body.endianness,
                                answer_id=f"embd-{uuid.uuid4().hex}", model=gw.model_name, tokens=tokens)
        data = [{"object": "embedding", "index": i, "embedding": row_value(rows[i], fmt, dtype)}
                for i in range(len(rows))]
        return json_response({"object": "list", "data": data, "model": gw.model_name, "usage": usage(tokens)})


async def _late_chunked(request: Request, gw, body: EmbeddingsRequest, deadline: float, *, fmt: str,
                        lane: str | None):
    """Jina's late_chunking: the input texts are one document's chunks, each embedded with the others as its
    context (one sequence, each chunk's token span mean-pooled), as /v1/contextualizedembeddings embeds a document.
    Nothing is cut: a document over the model's length is a 422 naming input; a prompt would sit before the first
    chunk only, so a model's prompt (input_type, prompt_name, its default) is refused with it."""
    texts = body.input.texts
    if texts is None:
        raise IvyError(Problem.INVALID_PARAMETER, "late_chunking embeds texts: send the chunks as text",
                       param="late_chunking")
    if gw.encoder.prompt_for(body.input_type, body.prompt_name):
        raise IvyError(Problem.INVALID_PARAMETER, "late_chunking with a prompt is not served (the prompt would "
                       "precede the first chunk only); send no input_type or prompt_name, or use a model without "
                       "a default prompt", param="late_chunking")
    gw.check_count(len(texts), gw.config.max_chunks_per_request, "input")
    dims = gw.check_dimensions(body.dimensions)
    try:
        docs = await gw.encoder.encode_documents([texts])
    except IvyError as exc:  # named input[0], the one document: here the whole input
        if exc.param != "input[0]":
            raise
        message = exc.message.replace("input[0]", "the input (its chunks as one sequence)", 1)
        raise IvyError(exc.problem, message, param="input", limit=exc.limit) from None
    request_trace.count_usage("/v1/embeddings", len(texts), len(docs.sequences[0]))
    rows = await unless_disconnected(request, gw.embed(
        docs.sequences, spans=docs.spans, deadline=deadline, dimensions=dims, normalize=body.normalize,
        encoding=WIRE_ENCODING[fmt], lane=lane))
    return rows, len(docs.sequences[0])


@router.post("/embed", openapi_extra=request_body(TeiEmbedRequest))
@router.post("/", openapi_extra=request_body(TeiEmbedRequest), include_in_schema=False)
async def tei_embed(request: Request) -> Response:
    """text-embeddings-inference's /embed, for its clients: `inputs` in, a bare list of float lists out
    (normalized unless `normalize: false`); errors keep the OpenAI shape of every other route. Also at
    POST / as TEI serves it (huggingface_hub's feature_extraction posts to the base URL)."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, TeiEmbedRequest, "embed", "/embed")
    with gw.admit():
        rows, _ = await _embed_inputs(request, body.inputs, deadline, route="/embed", param="inputs", fmt="float",
                                      truncate=body.truncate, side=body.truncation_side,
                                      prompt=(None, body.prompt_name), dimensions=body.dimensions,
                                      normalize=body.normalize, lane=lane)
        return json_response(rows)


@router.post("/pooling", openapi_extra=request_body(PoolingRequest), responses={200: {"model": PoolingResponse}})
async def vllm_pooling(request: Request) -> Response:
    """vLLM's pooling API for an embedding model: /v1/embeddings' vectors (the same prompt, tokens and replicas)
    in vLLM's shape, each as {"index", "object": "pooling", "data"}; `encoding_format` defaults to float for every
    model. `truncate_prompt_tokens` -1 cuts to the model's length, k keeps k tokens. Fields vLLM has that Ivy
    cannot honour (chat messages, other tasks, ...) are refused by name (ivy.pooling)."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, PoolingRequest, "embed", "/pooling")
    truncate, max_tokens = input_truncation(gw, body)
    with gw.admit():
        fmt = body.encoding_format or "float"
        dtype = wire_dtype(fmt, body.embed_dtype, body.endianness)  # before any work: it may refuse
        rows, tokens = await _embed_inputs(request, body.input, deadline, route="/pooling", param="input", fmt=fmt,
                                           truncate=truncate, side=body.truncation_side or "right", prompt=(None, None),
                                           dimensions=body.dimensions, normalize=body.normalize, lane=lane,
                                           max_tokens=max_tokens)
        rid = request_trace.REQUEST_ID.get() or uuid.uuid4().hex  # X-Request-Id when the client sent a sane one
        if body.request_id is not None and rid != request.headers.get("x-request-id"):
            rid = body.request_id
        if fmt in RAW_FORMATS:
            return bytes_answer(rows, fmt, dtype, embed_dtype=body.embed_dtype, endianness=body.endianness,
                                answer_id=f"pool-{rid}", model=gw.model_name, tokens=tokens)
        data = [{"index": i, "object": "pooling", "data": row_value(rows[i], fmt, dtype)} for i in range(len(rows))]
        return json_response({"id": f"pool-{rid}", "object": "list", "created": int(time.time()),
                              "model": gw.model_name, "data": data,
                              "usage": {**usage(tokens), "completion_tokens": 0, "prompt_tokens_details": None}})


async def _embed_inputs(request: Request, inputs, deadline: float, *, route: str, param: str, fmt: str,
                        truncate: bool | None, side: str, prompt: tuple[str | None, str | None],
                        dimensions: int | None, normalize: bool | None, lane: str | None = None,
                        max_tokens: int | None = None):
    """Texts or token ids -> (rows in `fmt`'s wire encoding, tokens sent): limits, templating (texts only:
    `prompt` is (input_type, prompt_name)), tokenizing (cut to `max_tokens` when given), replicas."""
    gw = gateway_of(request)
    gw.check_count(len(inputs), gw.config.max_inputs_per_request, param)
    dims = gw.check_dimensions(dimensions)
    seqs = await encode_inputs(gw, inputs, route=route, param=param, truncate=truncate, side=side, prompt=prompt,
                               max_tokens=max_tokens)
    rows = await unless_disconnected(request, gw.embed(
        seqs, deadline=deadline, dimensions=dims, normalize=normalize, encoding=WIRE_ENCODING[fmt], lane=lane))
    return rows, sum(map(len, seqs))


async def encode_inputs(gw, inputs, *, route: str, param: str, truncate: bool | None, side: str,
                        prompt: tuple[str | None, str | None], max_tokens: int | None = None) -> list[list[int]]:
    """Texts (templated by `prompt` = (input_type, prompt_name), tokenized) or token ids (checked) -> the
    sequences to send, counted in the route's input and token metrics once the request is answered (a request
    the replicas fail counts none: request_trace.count_usage); the caller checks the input count.
    max_tokens: the length to cut to when truncating (vLLM's truncate_prompt_tokens); None = the model's."""
    truncate = gw.config.truncate if truncate is None else truncate
    if inputs.texts is not None:
        seqs = await gw.encoder.encode_texts(inputs.texts, truncate=truncate, side=side,
                                             prompt=gw.encoder.prompt_for(*prompt), param=param, one=inputs.flat,
                                             max_tokens=max_tokens)
    else:
        seqs = await gw.encoder.check_ids(inputs.ids, truncate=truncate, side=side, param=param, flat=inputs.flat,
                                          max_tokens=max_tokens)
    request_trace.count_usage(route, len(seqs), sum(map(len, seqs)))
    return seqs


@router.post("/v1/contextualizedembeddings", openapi_extra=request_body(ContextualizedEmbeddingsRequest),
             responses={200: {"model": ContextualizedEmbeddingsResponse}})
async def create_contextualized_embeddings(request: Request) -> Response:
    """One embedding per chunk, computed with its whole document as context: the document's chunks are
    joined into one sequence and each chunk's token span is mean-pooled (late chunking)."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, ContextualizedEmbeddingsRequest, "embed",
                                                 "/v1/contextualizedembeddings")
    with gw.admit():
        gw.check_count(len(body.input), gw.config.max_inputs_per_request)
        gw.check_count(sum(map(len, body.input)), gw.config.max_chunks_per_request, "input chunks")
        dimensions = gw.check_dimensions(body.dimensions)
        fmt = body.encoding_format or default_format(gw.spec.native_int8)
        docs = await gw.encoder.encode_documents(body.input)
        rows = await unless_disconnected(request, gw.embed(
            docs.sequences, spans=docs.spans, deadline=deadline, dimensions=dimensions, normalize=body.normalize,
            encoding=WIRE_ENCODING[fmt], lane=lane))
        tokens = sum(map(len, docs.sequences))
        metrics.INPUTS.labels("/v1/contextualizedembeddings").inc(len(rows))
        metrics.TOKENS.labels("/v1/contextualizedembeddings").inc(tokens)
        data, row = [], 0
        for i, doc_spans in enumerate(docs.spans):
            chunks = [{"object": "embedding", "index": j, "embedding": row_value(rows[row + j], fmt)}
                      for j in range(len(doc_spans))]
            row += len(doc_spans)
            data.append({"object": "list", "index": i, "data": chunks})
        return json_response({"object": "list", "data": data, "model": gw.model_name, "usage": usage(tokens)})

def bytes_answer(rows: np.ndarray, fmt: str, dtype: str, *, embed_dtype: str | None, endianness: str | None,
                 answer_id: str, model: str, tokens: int) -> Response:
    """vLLM's raw answer (`encoding_format` bytes or bytes_only): application/octet-stream, every row's bytes back
    to back; for bytes a `metadata` header, JSON of the id, created, model, each row's {"index", "embed_dtype",
    "endianness", "start", "end", "shape"} (byte offsets into the body) and the usage, as vLLM's
    encode_pooling_bytes writes it."""
    body = value_bytes(rows, dtype)
    headers = None
    if fmt == "bytes":
        size = len(body) // max(len(rows), 1)
        shape = list(rows.shape[1:])
        kind, order = embed_dtype or "float32", endianness or "native"
        data = [{"index": i, "embed_dtype": kind, "endianness": order, "start": i * size, "end": (i + 1) * size,
                 "shape": shape} for i in range(len(rows))]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        meta = {"id": answer_id, "created": int(time.time()), "model": model, "data": data, "usage": usage}
        headers = {"metadata": orjson.dumps(meta).decode()}
    return Response(body, media_type="application/octet-stream", headers=headers)

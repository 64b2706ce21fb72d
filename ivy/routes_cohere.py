"""POST /v2/embed: Cohere's embed API (v2; the cohere SDK's `ClientV2.embed`, and vLLM's route of the same name) for
an embedding model, beside /v2/rerank; POST /v1/embed, the older API (the SDK's `Client.embed`), the same way.

`texts` (or `inputs`, each one text block) in; `embeddings` by type out: `float`, `base64` (little-endian float32),
`ubinary` (one bit a dimension, set where the value is >= 0 as vLLM packs it, most significant bit first, as
unsigned bytes) and `binary` (the same bytes less 128, signed), only the types asked (default float). `input_type`
picks the prompt: search_query and search_document the model's query and document prompts as /v1/embeddings'
input_type does, classification and clustering a prompt of that name where the model has one (none otherwise).
`truncate` END (default, null too: the SDK sends null for an argument left None) and START cut an over-long text at
that end, NONE refuses it; `max_tokens` is the length to cut to (or, with NONE, the longest a text may be), special
tokens included; `output_dimension` (or `dimensions`, every other route's name) is Matryoshka's `dimensions`.
What a text-only server cannot honour is a 422 naming the field: images, image blocks, `input_type: image`, and the
int8 / uint8 types (Cohere's own calibrated quantization; /v1/embeddings' base64_int8 is Ivy's).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter
from pydantic import Field, PlainValidator, WithJsonSchema
from starlette.requests import Request
from starlette.responses import Response

from ivy.encode import row_value
from ivy.errors import IvyError, Problem
from ivy.inputs import Dimensions, Inputs, _wrong, parse_texts
from ivy.routes_embeddings import encode_inputs
from ivy.schemas import Priority, _Request
from ivy.tokenization import CUT_HINT
from ivy.web import gateway_of, json_response, request_body, unless_disconnected

router = APIRouter()

EmbeddingType = Literal["float", "base64", "binary", "ubinary", "int8", "uint8"]
_SEARCH_TYPES = ("search_query", "search_document")  # /v1/embeddings' input_type takes these as they are


def _text_blocks(value: Any) -> list[str]:
    """Cohere v2's `inputs`: [{"content": [{"type": "text", "text": ...}]}, ...], one text block an input."""
    if not isinstance(value, list) or not value:
        raise _wrong("inputs", 'a non-empty list of {"content": [{"type": "text", "text": string}]}')
    texts = []
    for i, item in enumerate(value):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
            raise _wrong(f"inputs[{i}].content", "one text block (a text-only model embeds one text an input)")
        block = content[0]
        if block.get("type") != "text":
            raise IvyError(Problem.INVALID_PARAMETER, f"inputs[{i}].content[0]: only text blocks are embedded here; "
                           "this model reads no images", param=f"inputs[{i}].content[0]")
        text = block.get("text")
        if not isinstance(text, str):
            raise _wrong(f"inputs[{i}].content[0].text", "a string")
        texts.append(text)
    return parse_texts(texts, "inputs")


class CohereEmbedRequest(_Request):
    """Cohere's embed v2 request (see the module's docstring for what each field does here)."""

    texts: Annotated[list[str], PlainValidator(lambda v: parse_texts(v, "texts")), WithJsonSchema(
        {"type": "array", "items": {"type": "string", "minLength": 1}})] | None = None
    inputs: Annotated[list[str], PlainValidator(_text_blocks), WithJsonSchema({"type": "array", "items": {
        "type": "object"}})] | None = None
    images: list[Any] | None = Field(default=None, description="Not served: this model reads no images.")
    input_type: Literal["search_query", "search_document", "classification", "clustering", "image"] | None = None
    embedding_types: list[EmbeddingType] | None = Field(default=None, description="float (default), base64, binary, "
                                                        "ubinary; int8 and uint8 are not served.")
    truncate: Literal["NONE", "START", "END"] | None = None  # None (the SDK's null too): END
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    output_dimension: Dimensions | None = None
    priority: Priority = None


@router.post("/v2/embed", openapi_extra=request_body(CohereEmbedRequest))
@router.post("/v1/embed", openapi_extra=request_body(CohereEmbedRequest))
async def cohere_embed(request: Request) -> Response:
    """Cohere's embed, v2 (ClientV2) and v1 (the older Client, LangChain's CohereEmbeddings): the same work; v1
    without embedding_types answers its older shape, a list of float lists as `embeddings_floats`."""
    gw = gateway_of(request)
    route = "/v1/embed" if request.scope["path"].rstrip("/").endswith("/v1/embed") else "/v2/embed"
    body, deadline, lane = await gw.open_request(request, CohereEmbedRequest, "embed", route)
    texts, param = _texts_of(body)
    types = list(dict.fromkeys(body.embedding_types or ["float"]))
    _refuse_images_and_quantized(body, types)
    cut = _max_tokens(gw, body.max_tokens)
    with gw.admit():
        gw.check_count(len(texts), gw.config.max_inputs_per_request, param)
        dims = gw.check_dimensions(body.output_dimension, "output_dimension")
        width = dims or gw.spec.dimensions
        if width % 8 and ("binary" in types or "ubinary" in types):
            raise IvyError(Problem.INVALID_PARAMETER, f"embedding_types: binary and ubinary pack 8 dimensions a byte; "
                           f"{width} is not a multiple of 8", param="embedding_types")
        cutting = body.truncate != "NONE"  # END, START, or omitted
        try:
            seqs = await encode_inputs(gw, Inputs(texts=texts), route=route, param=param, truncate=cutting,
                                       side="left" if body.truncate == "START" else "right",
                                       prompt=_prompt(gw, body.input_type), max_tokens=cut if cutting else None)
        except IvyError as exc:  # its hint is /v1/embeddings' (truncate=true): Cohere's truncate is END or START
            if CUT_HINT not in exc.message:
                raise
            hint = exc.message.replace(CUT_HINT, "send truncate END or START to cut it")
            raise IvyError(exc.problem, hint, param=exc.param, limit=exc.limit) from None
        if not cutting and cut is not None:
            long = next((i for i, s in enumerate(seqs) if len(s) > cut), None)
            if long is not None:
                raise IvyError(Problem.INPUT_TOO_LONG, f"{param}[{long}] has {len(seqs[long])} tokens, over max_tokens "
                               f"({cut}); send truncate END or START to cut it", param=f"{param}[{long}]", limit=cut)
        rows = await unless_disconnected(request, gw.embed(seqs, deadline=deadline, dimensions=dims, lane=lane))
        tokens = sum(map(len, seqs))
        version = route[2]  # "1" or "2"
        answer = {"id": f"embd-{uuid.uuid4().hex}", "texts": texts,
                  "meta": {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}}
        if version == "1" and body.embedding_types is None:
            return json_response({**answer, "embeddings": rows, "response_type": "embeddings_floats"})
        return json_response({**answer, "embeddings": {t: _typed(rows, t) for t in types},
                              "response_type": "embeddings_by_type"})


def _texts_of(body: CohereEmbedRequest) -> tuple[list[str], str]:
    if body.images is not None:
        raise IvyError(Problem.INVALID_PARAMETER, "images: this model reads no images; send texts", param="images")
    if (body.texts is None) == (body.inputs is None):
        raise IvyError(Problem.INVALID_PARAMETER, "send one of texts and inputs", param="texts")
    return (body.texts, "texts") if body.texts is not None else (body.inputs, "inputs")


def _refuse_images_and_quantized(body: CohereEmbedRequest, types: list[str]) -> None:
    if body.input_type == "image":
        raise IvyError(Problem.INVALID_PARAMETER, "input_type: image is not served; this model reads no images",
                       param="input_type")
    quantized = [t for t in types if t in ("int8", "uint8")]
    if quantized:
        raise IvyError(Problem.INVALID_PARAMETER, f"embedding_types: {quantized[0]} is not served (Cohere's own "
                       "quantization); ask float, base64, binary or ubinary, or /v1/embeddings' base64_int8",
                       param="embedding_types")


def _max_tokens(gw, value: int | None) -> int | None:
    """max_tokens as the length to cut to (special tokens included): the model's length at most; it must leave room
    for a text's special tokens and one more."""
    if value is None:
        return None
    least = gw.tokenizer.num_special + 1
    if value < least:
        raise IvyError(Problem.INVALID_PARAMETER, f"max_tokens must be at least {least} (a text's "
                       f"{least - 1} special tokens and one more), got {value}", param="max_tokens")
    return min(value, gw.spec.max_length)


def _prompt(gw, input_type: str | None) -> tuple[str | None, str | None]:
    """(input_type, prompt_name) for encode_inputs: the query / document prompts, or a prompt named as the type."""
    if input_type in _SEARCH_TYPES:
        return input_type, None
    if input_type is not None and input_type in gw.spec.prompts:
        return None, input_type
    return None, None


def _typed(rows: np.ndarray, kind: str) -> Any:
    if kind == "float":
        return rows
    if kind == "base64":
        return [row_value(r, "base64") for r in rows]
    packed = np.packbits(rows >= 0, axis=1)  # most significant bit first
    return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)


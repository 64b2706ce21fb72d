"""POST /tokenize: vLLM's body ({"prompt", "add_special_tokens", "return_token_strs"} -> {"count", "max_model_len",
"tokens", "token_strs"}): a text's token ids and count, as the served model tokenizes it, with its max length beside
them, so a client can chunk documents to fit before embedding them; or text-embeddings-inference's ({"inputs": a
text or texts, "add_special_tokens", "prompt_name"} -> per text a list of {"id", "text", "special", "start", "stop"},
byte offsets as TEI gives them), chosen by the body's keys (tokenize_schema). The way back:
POST /detokenize (vLLM's: {"tokens"} -> {"prompt"}, special tokens kept as vLLM keeps them) and POST /decode (text-embeddings-inference's: {"ids":
one list or several, "skip_special_tokens"} -> a list of texts)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy.gateway import Gateway
from ivy.inputs import sent_as_one
from ivy.responses import TeiTokenizeResponse, TokenizeResponse
from ivy.token_schemas import DecodeRequest, DetokenizeRequest, TeiTokenizeRequest, TokenizeRequest
from ivy.web import gateway_of, json_response, request_body

router = APIRouter()


def tokenize_schema(data: Any) -> type[TokenizeRequest | TeiTokenizeRequest]:
    """POST /tokenize's body: text-embeddings-inference's when it has `inputs` and no `prompt`, else vLLM's."""
    tei = isinstance(data, dict) and "inputs" in data and "prompt" not in data
    return TeiTokenizeRequest if tei else TokenizeRequest


@router.post("/tokenize", openapi_extra=request_body(TokenizeRequest, TeiTokenizeRequest),
             responses={200: {"model": TokenizeResponse | TeiTokenizeResponse}})
async def tokenize(request: Request) -> Response:
    """vLLM's body answered in its shape (`token_strs` null unless return_token_strs); a body with `inputs` and no
    `prompt` is text-embeddings-inference's, answered with a list of tokens per input."""
    gw = gateway_of(request)
    body, _, _ = await gw.open_request(request, tokenize_schema)
    if isinstance(body, TeiTokenizeRequest):
        return await _tei_tokenize(gw, body)
    with gw.admit():
        ids = await gw.token_texts.tokenize(body.prompt, body.add_special_tokens)
        strs = await gw.token_texts.token_strs(ids) if body.return_token_strs else None
    return json_response({"count": len(ids), "max_model_len": gw.spec.max_length, "tokens": ids,
                          "token_strs": strs})


async def _tei_tokenize(gw: Gateway, body: TeiTokenizeRequest) -> Response:
    texts = body.inputs
    names = ["inputs"] if sent_as_one(texts) else [f"inputs[{i}]" for i in range(len(texts))]
    prompt = gw.encoder.prompt_for(None, body.prompt_name)
    with gw.admit():
        gw.check_count(len(texts), gw.config.max_inputs_per_request, "inputs")
        answer = await gw.token_texts.tokenize_spans(texts, body.add_special_tokens, prompt, names)  # its JSON bytes
        return Response(answer, media_type="application/json")


@router.post("/detokenize", openapi_extra=request_body(DetokenizeRequest))
async def detokenize(request: Request) -> Response:
    gw = gateway_of(request)
    body, _, _ = await gw.open_request(request, DetokenizeRequest)
    with gw.admit():
        (text,) = await gw.token_texts.decode([body.tokens], False, ["tokens"])  # vLLM keeps them
    return json_response({"prompt": text})


@router.post("/decode", openapi_extra=request_body(DecodeRequest), responses={200: {"model": list[str]}})
async def decode(request: Request) -> Response:
    gw = gateway_of(request)
    body, _, _ = await gw.open_request(request, DecodeRequest)
    several = bool(body.ids) and isinstance(body.ids[0], list)
    seqs = body.ids if several else [body.ids]
    names = [f"ids[{i}]" for i in range(len(seqs))] if several else ["ids"]
    with gw.admit():
        gw.check_count(len(seqs), gw.config.max_inputs_per_request, "ids")
        texts = await gw.token_texts.decode(seqs, body.skip_special_tokens, names)
    return json_response(texts)

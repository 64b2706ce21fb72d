"""POST /tokenize (vLLM's shape): a text's token ids and count, as the served model tokenizes it, with
its max length beside them, so a client can chunk documents to fit before embedding them. The way back:
POST /detokenize (vLLM's: {"tokens"} -> {"prompt"}, special tokens kept as vLLM keeps them) and POST /decode (text-embeddings-inference's: {"ids":
one list or several, "skip_special_tokens"} -> a list of texts)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy.schemas import DecodeRequest, DetokenizeRequest, TokenizeRequest
from ivy.web import gateway_of, json_response, request_body

router = APIRouter()


@router.post("/tokenize", openapi_extra=request_body(TokenizeRequest))
async def tokenize(request: Request) -> Response:
    gw = gateway_of(request)
    body, _, _ = await gw.open_request(request, TokenizeRequest)
    with gw.admit():
        ids = await gw.encoder.tokenize(body.prompt, body.add_special_tokens)
    return json_response({"count": len(ids), "max_model_len": gw.spec.max_length, "tokens": ids})


@router.post("/detokenize", openapi_extra=request_body(DetokenizeRequest))
async def detokenize(request: Request) -> Response:
    gw = gateway_of(request)
    body, _, _ = await gw.open_request(request, DetokenizeRequest)
    with gw.admit():
        (text,) = await gw.encoder.decode([body.tokens], False, ["tokens"])  # vLLM keeps them
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
        texts = await gw.encoder.decode(seqs, body.skip_special_tokens, names)
    return json_response(texts)

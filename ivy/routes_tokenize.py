"""POST /tokenize (vLLM's shape): a text's token ids and count, as the served model tokenizes it, with
its max length beside them, so a client can chunk documents to fit before embedding them."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy.schemas import TokenizeRequest
from ivy.web import gateway_of, json_response, request_body

router = APIRouter()


@router.post("/tokenize", openapi_extra=request_body(TokenizeRequest))
async def tokenize(request: Request) -> Response:
    gw = gateway_of(request)
    gw.authorize(request.headers.get("authorization"))
    body, _ = await gw.read_request(request, TokenizeRequest)
    with gw.admit():
        ids = await gw.encoder.tokenize(body.prompt, body.add_special_tokens)
    return json_response({"count": len(ids), "max_model_len": gw.spec.max_length, "tokens": ids})

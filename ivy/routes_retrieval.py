"""POST /embed_sparse (text-embeddings-inference's route) and POST /embed_multi_vector, for sparse and
multi-vector models (SPLADE, BGE-M3; ivy.retrieval). Same path as /embed: auth -> bounded body -> schema ->
model and task checks -> admission -> tokenize off the loop -> Gateway.embed -> the answer.

/embed_sparse answers text-embeddings-inference's EmbedSparseResponse, `[[{"index": 3, "value": 0.5}, ...], ...]`:
per input its non-zero weights, ids ascending, so TEI's clients read it unchanged; /embed_multi_vector
`[[[float, ...], ...], ...]`: per input its token vectors.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy.retrieval import retrieval_of
from ivy.routes_embeddings import encode_inputs
from ivy.responses import SparseEmbedResponse
from ivy.schemas import MultiVectorEmbedRequest, SparseEmbedRequest
from ivy.web import gateway_of, json_response, request_body, unless_disconnected

router = APIRouter()


@router.post("/embed_sparse", openapi_extra=request_body(SparseEmbedRequest),
             responses={200: {"model": SparseEmbedResponse}})
async def embed_sparse(request: Request) -> Response:
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, SparseEmbedRequest, "sparse", "/embed_sparse")
    with gw.admit():
        gw.check_count(len(body.inputs), gw.config.max_inputs_per_request, "inputs")
        seqs = await encode_inputs(gw, body.inputs, route="/embed_sparse", param="inputs", truncate=body.truncate,
                                   side=body.truncation_side, prompt=(None, body.prompt_name))
        work = retrieval_of(gw).sparse(seqs, deadline=deadline, top_k=body.top_k, lane=lane, param="inputs")
        found = await unless_disconnected(request, work)
        # A dict per weight is TEI's shape and most of this route's own cost: 100 SPLADE rows of 500 weights
        # serialize in ~11 ms, against ~2 ms as two lists per input (this VM).
        return json_response([[{"index": i, "value": v} for i, v in zip(idx, vals)] for idx, vals in found])


@router.post("/embed_multi_vector", openapi_extra=request_body(MultiVectorEmbedRequest))
async def embed_multi_vector(request: Request) -> Response:
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, MultiVectorEmbedRequest, "multi-vector",
                                                 "/embed_multi_vector")
    with gw.admit():
        gw.check_count(len(body.inputs), gw.config.max_inputs_per_request, "inputs")
        seqs = await encode_inputs(gw, body.inputs, route="/embed_multi_vector", param="inputs",
                                   truncate=body.truncate, side=body.truncation_side, prompt=(None, body.prompt_name))
        work = retrieval_of(gw).vectors(seqs, deadline=deadline, lane=lane, param="inputs")
        found = await unless_disconnected(request, work)
        return json_response(found)

"""POST /v1/score (vLLM's shape; also at /score) and POST /v1/rerank (Cohere's and Jina's shape; also at
/v2/rerank, and at /rerank, which takes text-embeddings-inference's shape too): relevance scores. POST
/similarity (text-embeddings-inference's): the symmetric cosine of one sentence with others.

With an embedding model, cosine scores: queries are templated as queries and documents as documents (the
model's prompts, when it has them); everything is embedded in one batch with normalize=true, so a score is
a dot product of unit vectors. With a cross-encoder (reranker) served, each (query, document) pair is
scored by the model itself (ivy.cross_encode). With a multi-vector model (BGE-M3, ColBERT), `scoring`
chooses cosine or late interaction (MaxSim over the token vectors, ivy.late_interaction); omitted, a model
that embeds (BGE-M3) scores by cosine as vLLM and text-embeddings-inference do, a multi-vector-only one by
MaxSim; a mode the model cannot compute is a 422 naming `scoring`.
vLLM's truncate_prompt_tokens is served as /pooling serves it (ivy.pooling's prompt_truncation): -1 cuts to the
model's length, k keeps k tokens of each text (its special tokens and prompt included), or of each pair for a
cross-encoder (ivy.cross_encode's pair_truncation); omitted, `truncate` decides. Metrics count the request's
texts (queries and documents, whatever the model) and the tokens sent, once answered.
The priority lane is chosen as for /v1/embeddings (ivy/lanes.py: body `priority`, X-Priority, the key's).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy import metrics
from ivy.cross_encode import check_instruction, cross_scores, pair_truncation
from ivy.errors import IvyError, Problem
from ivy.gateway import Gateway
from ivy.late_interaction import CROSS, MAXSIM, encode_queries_and_documents, maxsim_scores, scoring_of
from ivy.pooling import prompt_truncation
from ivy.web import gateway_of, json_response, request_body, unless_disconnected, usage
from ivy.responses import RerankResponse, ScoreResponse, TeiRerankResult
from ivy.schemas import (RerankRequest, ScoreRequest, SimilarityParameters, SimilarityRequest, TeiRerankRequest,
                         rerank_schema)

router = APIRouter()


def _truncation(gw: Gateway, mode: str, value: int | None, truncate: bool | None) -> tuple[bool | None, int | None]:
    """(truncate, max_tokens) of the request's truncate_prompt_tokens and truncate: per pair for a cross-encoder,
    per text otherwise (each text tokenized and cut on its own, as vLLM's embedding scoring does)."""
    if mode == CROSS:
        return pair_truncation(gw, value, truncate)
    return prompt_truncation(value, truncate, gw.spec.max_length, gw.tokenizer.num_special, texts=True)


async def _scores(request: Request, gw: Gateway, mode: str, queries: list[str], docs: list[str], *,
                  truncate: bool | None, side: str, deadline: float, instruction: str | None,
                  names: tuple[str, str], lane: str | None, max_tokens: int | None,
                  raw: bool = False) -> tuple[np.ndarray, int]:
    """Scores of queries[i] with docs[i], or of the one query with every document, by `mode` (the cross-encoder's,
    MaxSim over token vectors (ivy.late_interaction) or the cosine of unit vectors), and the tokens sent.
    max_tokens: each text's cut, or each pair's for a cross-encoder (_truncation). raw: a cross-encoder's logits
    (vLLM's use_activation false, TEI's and Infinity's raw_scores true); the other modes' scores are raw."""
    if mode == CROSS:
        return await cross_scores(request, gw, queries, docs, truncate=truncate, side=side, deadline=deadline,
                                  instruction=instruction, names=names, lane=lane, max_tokens=max_tokens, raw=raw)
    check_instruction(gw, instruction)
    if mode == MAXSIM:
        return await maxsim_scores(request, gw, queries, docs, truncate=truncate, side=side, deadline=deadline,
                                   names=names, lane=lane, max_tokens=max_tokens)
    q_seqs, d_seqs = await encode_queries_and_documents(gw, queries, docs, truncate=truncate, side=side, names=names,
                                                        max_tokens=max_tokens)
    rows = await unless_disconnected(request, gw.embed(q_seqs + d_seqs, deadline=deadline, normalize=True,
                                                          lane=lane))
    q, d = rows[: len(q_seqs)], rows[len(q_seqs):]
    tokens = sum(map(len, q_seqs)) + sum(map(len, d_seqs))
    return (d @ q[0] if len(q) == 1 else np.einsum("ij,ij->i", q, d)), tokens


@router.post("/v1/score", openapi_extra=request_body(ScoreRequest), responses={200: {"model": ScoreResponse}})
@router.post("/score", openapi_extra=request_body(ScoreRequest), include_in_schema=False)  # vLLM serves both
async def score(request: Request) -> Response:
    """text_1 (one text) against every text_2, or text_1[i] against text_2[i] when both have the same length;
    cosine, MaxSim (`scoring`; a BGE-M3 defaults to cosine, a multi-vector-only model to MaxSim) or the
    cross-encoder's score."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, ScoreRequest)  # outside the cap: a slow body holds no slot
    mode = scoring_of(gw, body.scoring, "/v1/score")
    truncate, max_tokens = _truncation(gw, mode, body.truncate_prompt_tokens, body.truncate)
    first, second = body.names
    with gw.admit():
        gw.check_count(len(body.text_2), gw.config.max_inputs_per_request, second)
        if len(body.text_1) != 1 and len(body.text_1) != len(body.text_2):
            raise IvyError(Problem.INVALID_PARAMETER, f"{first} has {len(body.text_1)} texts; it needs 1 or as many "
                           f"as {second} ({len(body.text_2)})", param=first)
        scores, tokens = await _scores(request, gw, mode, body.text_1, body.text_2, truncate=truncate,
                                       side=body.truncation_side, deadline=deadline, instruction=body.instruction,
                                       names=body.names, lane=lane, max_tokens=max_tokens,
                                       raw=body.use_activation is False)
        metrics.INPUTS.labels("/v1/score").inc(len(body.text_1) + len(body.text_2))  # texts, pairs or not
        metrics.TOKENS.labels("/v1/score").inc(tokens)
        data = [{"object": "score", "index": i, "score": float(s)} for i, s in enumerate(scores)]
        return json_response({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                              "model": gw.model_name, "data": data, "usage": usage(tokens)})


@router.post("/v1/rerank", openapi_extra=request_body(RerankRequest), responses={200: {"model": RerankResponse}})
@router.post("/v2/rerank", openapi_extra=request_body(RerankRequest), responses={200: {"model": RerankResponse}},
             include_in_schema=False)  # where Cohere's v2 client posts; same body and answer
async def rerank(request: Request) -> Response:
    """Documents ordered by relevance to the query: cosine, MaxSim (`scoring`; a BGE-M3 defaults to cosine, a
    multi-vector-only model to MaxSim) or the cross-encoder's score; `top_n` keeps the best n;
    `return_documents` echoes each document as {"text": ...} (Cohere's and Jina's response shape, `results`); beside
    it Voyage's (`object` list and `data`, its document a string with return_documents only), which its SDK reads."""
    return await _rerank(request, RerankRequest, "/v1/rerank")


@router.post("/rerank", openapi_extra=request_body(RerankRequest, TeiRerankRequest),
             responses={200: {"model": RerankResponse | list[TeiRerankResult]}})
async def rerank_peers(request: Request) -> Response:
    """Where text-embeddings-inference, vLLM and Infinity serve rerank: a body with `texts` (TEI's: `query`,
    `texts`, `return_text`, `raw_scores`, `truncate`, `truncation_direction`; vLLM's truncate_prompt_tokens
    too) is answered in TEI's shape, a list of {"index", "score", "text"?} by score; one with `documents` as
    /v1/rerank."""
    return await _rerank(request, rerank_schema, "/rerank")


async def _rerank(request: Request, schema, route: str) -> Response:
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, schema)  # outside the cap: a slow body holds no slot
    tei = isinstance(body, TeiRerankRequest)
    documents = body.texts if tei else body.documents
    names = ("query", "texts" if tei else "documents")
    mode = scoring_of(gw, None if tei else body.scoring, route)
    raw = body.raw_scores is True or body.use_activation is False
    cohere_v2 = request.scope["path"] == "/v2/rerank"
    per_doc, truncate = body.max_tokens_per_doc, body.truncate
    if truncate is None and (cohere_v2 or per_doc is not None):  # Cohere cuts documents, never refuses them
        truncate = True
    elif truncate is False and per_doc is not None:
        raise IvyError(Problem.INVALID_PARAMETER, "truncate: false contradicts max_tokens_per_doc; send one of them",
                       param="truncate")
    if per_doc is not None:
        gw.token_texts.check_cut("max_tokens_per_doc")
    instruction = None if tei else body.instruction
    check_instruction(gw, instruction)  # before any work (it is checked again where the pairs are made)
    truncate, max_tokens = _truncation(gw, mode, body.truncate_prompt_tokens, truncate)
    if not tei:
        _refuse_cohere_v1(body, gw.config.truncate if truncate is None else truncate)
    with gw.admit():
        gw.check_count(len(documents), gw.config.max_inputs_per_request, names[1])
        scored = documents  # echoed as sent, scored as cut
        if per_doc is not None:
            scored = await gw.token_texts.cut_to_tokens(documents, per_doc, body.truncation_side, names[1])
        scores, tokens = await _scores(request, gw, mode, [body.query], scored, truncate=truncate,
                                       side=body.truncation_side, deadline=deadline, instruction=instruction,
                                       names=names, lane=lane, max_tokens=max_tokens, raw=raw)
        order = np.argsort(-scores, kind="stable")
        metrics.INPUTS.labels(route).inc(1 + len(documents))
        metrics.TOKENS.labels(route).inc(tokens)
        if tei:
            return json_response([{"index": int(i), "score": float(scores[i]),
                                   **({"text": documents[i]} if body.return_text else {})} for i in order])
        if body.top_n:  # 0, vLLM's default, keeps every document as None does
            order = order[: body.top_n]
        echo = body.return_documents
        if echo is None:  # vLLM returns every document, Jina by default; Cohere v2 has no such field
            echo = not cohere_v2
        results, data = [], []
        for i in order:
            item = {"index": int(i), "relevance_score": float(scores[i])}
            results.append({**item, "document": {"text": documents[i]}} if echo else item)
            data.append({**item, "document": documents[i]} if body.return_documents else item)  # Voyage's shape
        return json_response({"id": f"rerank-{uuid.uuid4().hex}", "object": "list", "model": gw.model_name,
                              "results": results, "data": data, "usage": usage(tokens)})


def _refuse_cohere_v1(body: RerankRequest, truncate: bool | None) -> None:
    """Cohere v1's fields that would change the answer: rank_fields other than ["text"] (other keys of a document
    are not read), and max_chunks_per_doc above 1 with truncate (a long document would be cut, not chunked)."""
    if body.rank_fields is not None and body.rank_fields != ["text"]:
        raise IvyError(Problem.INVALID_PARAMETER, 'rank_fields: only ["text"] is scored; send each document\'s text '
                       "as its text (other keys are not read)", param="rank_fields")
    if (body.max_chunks_per_doc or 1) > 1 and truncate:
        raise IvyError(Problem.INVALID_PARAMETER, "max_chunks_per_doc: a long document is cut to the model's length "
                       "(truncate), not scored by chunks; send max_chunks_per_doc 1, or no truncate to have an "
                       "over-long document refused", param="max_chunks_per_doc")


@router.post("/similarity", openapi_extra=request_body(SimilarityRequest), responses={200: {"model": list[float]}})
async def similarity(request: Request) -> Response:
    """The cosine of `inputs.source_sentence` with each of `inputs.sentences`, in their order (a list of floats).
    Symmetric, as text-embeddings-inference computes it: every text gets the same prompt (`parameters.
    prompt_name`, else the model's default), not query and document templates; an embedding model only."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, SimilarityRequest, task="embed", route="/similarity")
    params = body.parameters or SimilarityParameters()
    sentences = body.inputs.sentences
    with gw.admit():
        gw.check_count(len(sentences), gw.config.max_inputs_per_request - 1, "inputs.sentences")  # + the source
        cut = gw.config.truncate if params.truncate is None else params.truncate
        prompt = gw.encoder.prompt_for(None, params.prompt_name, param="parameters.prompt_name")
        source, seqs = await asyncio.gather(*(
            gw.encoder.encode_texts(texts, truncate=cut, side=params.truncation_side, prompt=prompt, param=name,
                                    one=one)
            for texts, name, one in (([body.inputs.source_sentence], "inputs.source_sentence", True),
                                     (sentences, "inputs.sentences", False))))
        rows = await unless_disconnected(request, gw.embed(source + seqs, deadline=deadline, normalize=True,
                                                              lane=lane))
        tokens = sum(map(len, source)) + sum(map(len, seqs))
        metrics.INPUTS.labels("/similarity").inc(1 + len(seqs))
        metrics.TOKENS.labels("/similarity").inc(tokens)
        return json_response((rows[1:] @ rows[0]).tolist())

"""/v1/score and /v1/rerank with a multi-vector model served (BGE-M3, ColBERT): how a request is scored, and
late-interaction (MaxSim) scores.

Which score (`scoring_of`): a cross-encoder scores pairs itself and takes no `scoring`; otherwise `"cosine"`
(dense unit vectors) or `"maxsim"` (token vectors). Omitted, a model that embeds scores by cosine, BGE-M3
included, as vLLM (its BgeM3EmbeddingModel is a bi-encoder to /score; only its ColBERT models, marked
late-interaction, score by MaxSim) and text-embeddings-inference (dense only) do; a model that is
multi-vector and does not embed scores by MaxSim. A mode the model cannot compute is a 422 naming `scoring`.

MaxSim (`maxsim_scores`): queries are templated as queries and documents as documents (the model's prompts,
when it has them), and all their token vectors come from one Retrieval.vectors call (one Gateway.embed: the
same L2-normalized vectors, CLS left out, that /embed_multi_vector answers); each score is
rose.retrieval_rows.maxsim, which follows FlagEmbedding's BGEM3FlagModel.colbert_score (inference): for
each query vector the max dot product over the document's vectors, summed and divided by the query's
vector count.
"""

from __future__ import annotations

import asyncio

import numpy as np
from starlette.requests import Request

from ivy.errors import IvyError, Problem
from ivy.gateway import Gateway
from ivy.inputs import sent_as_one
from ivy.retrieval import retrieval_of
from ivy.web import unless_disconnected
from rose.retrieval_rows import maxsim

CROSS, COSINE, MAXSIM = "cross-encoder", "cosine", "maxsim"


def scoring_of(gw: Gateway, requested: str | None, route: str) -> str:
    """CROSS, COSINE or MAXSIM for this model and the request's `scoring` (None = the model's default)."""
    tasks = gw.spec.tasks
    if gw.cross_encoder:
        if requested is not None:
            raise IvyError(Problem.INVALID_PARAMETER, f"scoring is for embedding and multi-vector models; "
                           f"{gw.model_name!r} is a cross-encoder and scores each pair itself", param="scoring")
        return CROSS
    if "embed" not in tasks and "multi-vector" not in tasks:
        # SPLADE, a classifier: 400 naming its tasks
        gw.require_task("rerank" if "classify" in tasks else "embed", route)
    if requested is None:
        return COSINE if "embed" in tasks else MAXSIM
    needs = {COSINE: "embed", MAXSIM: "multi-vector"}[requested]
    if needs not in tasks:
        raise IvyError(Problem.INVALID_PARAMETER, f"scoring {requested!r} needs a model that does {needs!r}; "
                       f"{gw.model_name!r} does {', '.join(repr(t) for t in tasks)}", param="scoring")
    return requested


async def encode_queries_and_documents(gw: Gateway, queries: list[str], docs: list[str], *, truncate: bool | None,
                                       side: str, names: tuple[str, str],
                                       max_tokens: int | None = None) -> tuple[list, list]:
    """Token ids of the queries templated as queries and of the documents as documents (the model's prompts),
    tokenized concurrently, each cut to max_tokens when given (vLLM's truncate_prompt_tokens, with truncate);
    `names` are the two fields, for errors. Shared by cosine and MaxSim scoring."""
    cut = gw.config.truncate if truncate is None else truncate
    return await asyncio.gather(
        gw.encoder.encode_texts(queries, truncate=cut, side=side, prompt=gw.encoder.prompt_for("query", None),
                                param=names[0], one=sent_as_one(queries, single=True), max_tokens=max_tokens),
        gw.encoder.encode_texts(docs, truncate=cut, side=side, prompt=gw.encoder.prompt_for("document", None),
                                param=names[1], one=sent_as_one(docs), max_tokens=max_tokens))


async def maxsim_scores(request: Request, gw: Gateway, queries: list[str], docs: list[str], *, truncate: bool | None,
                        side: str, deadline: float, names: tuple[str, str], lane: str | None = None,
                        max_tokens: int | None = None) -> tuple[np.ndarray, int]:
    """float32 [len(docs)] MaxSim scores of (queries[i], docs[i]), or of the one query with every document,
    and the tokens sent (for usage)."""
    q_seqs, d_seqs = await encode_queries_and_documents(gw, queries, docs, truncate=truncate, side=side, names=names,
                                                        max_tokens=max_tokens)
    vectors = await unless_disconnected(request, retrieval_of(gw).vectors(q_seqs + d_seqs, deadline=deadline,
                                                                          lane=lane, param=names[1]))
    q, d = vectors[: len(q_seqs)], vectors[len(q_seqs):]
    scores = np.asarray([maxsim(q[0] if len(q) == 1 else q[i], doc) for i, doc in enumerate(d)], np.float32)
    return scores, sum(map(len, q_seqs)) + sum(map(len, d_seqs))

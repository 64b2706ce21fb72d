"""/v1/score and /v1/rerank with a cross-encoder served: (query, document) pairs in, one score per pair out.

The routes (ivy.routes_scoring) call `cross_scores` instead of embedding both sides when the served model
is a reranker (Gateway.cross_encoder). Each pair becomes one sequence (ivy.pairs); the pairs go through
Gateway.embed like any batch (chunked by tokens, spread over replicas, packed ragged by Tulip), and each
row is the pair's score as the engine computed it (rose.score_head: CrossEncoder's activation applied;
Qwen3-Reranker: P("yes")). `instruction` is Qwen3-Reranker's task line; other models refuse it.
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from ivy.errors import IvyError, Problem
from ivy.gateway import Gateway
from ivy.web import unless_disconnected


def check_instruction(gw: Gateway, instruction: str | None) -> None:
    """422 for an instruction the served model would not read (only yes/no rerankers take one)."""
    if instruction is not None and not (gw.cross_encoder and gw.spec.score_head.kind == "yes_no"):
        raise IvyError(Problem.INVALID_PARAMETER, "instruction is read by yes/no rerankers (Qwen3-Reranker) only; "
                       f"{gw.model_name!r} does not take one", param="instruction")


async def cross_scores(request: Request, gw: Gateway, queries: list[str], docs: list[str], *, truncate: bool | None,
                       side: str, deadline: float, instruction: str | None, names: tuple[str, str],
                       lane: str | None = None) -> tuple[np.ndarray, int]:
    """float32 [len(docs)] scores of (queries[i], docs[i]), or of the one query with every document, and
    the tokens sent (for usage)."""
    check_instruction(gw, instruction)
    cut = gw.config.truncate if truncate is None else truncate
    pairs = await gw.encoder.encode_pairs(queries, docs, truncate=cut, side=side, instruction=instruction,
                                          names=names)
    rows = await unless_disconnected(request, gw.embed(pairs.sequences, token_types=pairs.token_types,
                                                       deadline=deadline, lane=lane))
    return rows[:, 0], sum(map(len, pairs.sequences))

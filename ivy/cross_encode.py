"""/v1/score and /v1/rerank with a cross-encoder served: (query, document) pairs in, one score per pair out.

The routes (ivy.routes_scoring) call `cross_scores` instead of embedding both sides when the served model
is a reranker (Gateway.cross_encoder). Each pair becomes one sequence (ivy.pairs); the pairs go through
Gateway.embed like any batch (chunked by tokens, spread over replicas, packed ragged by Tulip), and each
row is the pair's score as the engine computed it (rose.score_head: CrossEncoder's activation applied;
Qwen3-Reranker: P("yes")), or for raw scores the logit before that activation, from the same forward (Tulip's
`logit` output: rose.cross_spec ScoreHead.outputs). `instruction` is Qwen3-Reranker's task line; other models
refuse it.

vLLM's truncate_prompt_tokens (`pair_truncation`) bounds the whole pair, as vLLM's cross-encoder scoring does:
it tokenizes text and text_pair in one call with truncation=True and max_length k (vllm/entrypoints/openai/
serving_score.py, _validate_truncation_size), so BERT's pair is cut longest first to k tokens, special tokens
included, and the ids equal vLLM's. A yes/no reranker keeps its prompt whole and cuts the middle to fit k (the
model card's process_inputs; a cut through the prompt's suffix would score a malformed prompt).
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from ivy.errors import IvyError, Problem
from ivy.gateway import Gateway
from ivy.pooling import prompt_truncation
from ivy.web import unless_disconnected
from rose.cross_spec import LOGIT
from rose.spec import find_output


def check_instruction(gw: Gateway, instruction: str | None) -> None:
    """422 for an instruction the served model would not read (only yes/no rerankers take one)."""
    if instruction is not None and not (gw.cross_encoder and gw.spec.score_head.kind == "yes_no"):
        raise IvyError(Problem.INVALID_PARAMETER, "instruction is read by yes/no rerankers (Qwen3-Reranker) only; "
                       f"{gw.model_name!r} does not take one", param="instruction")


def pair_truncation(gw: Gateway, value: int | None, truncate: bool | None) -> tuple[bool | None, int | None]:
    """truncate_prompt_tokens for pairs as (truncate, max_tokens), as ivy.pooling's prompt_truncation reads it
    for texts: omitted = `truncate`, -1 = the model's length, k = k tokens for the whole pair, which must leave
    room for what a pair adds around its texts (special tokens, a yes/no reranker's prompt) and one token more."""
    pairs = gw.encoder.pairs
    least, most = pairs.added + 1, pairs.max_length
    if value is not None and value != -1 and not least <= value <= most:
        around = "the prompt" if pairs.yes_no else "the special tokens"
        raise IvyError(Problem.INVALID_PARAMETER, f"truncate_prompt_tokens must be -1 (the model's length, {most}) "
                       f"or between {least} ({around} a pair gets, {pairs.added} tokens, and one more) and {most}, "
                       f"got {value}", param="truncate_prompt_tokens", limit=most)
    return prompt_truncation(value, truncate, most, 0, texts=False)


async def cross_scores(request: Request, gw: Gateway, queries: list[str], docs: list[str], *, truncate: bool | None,
                       side: str, deadline: float, instruction: str | None, names: tuple[str, str],
                       lane: str | None = None, max_tokens: int | None = None,
                       raw: bool = False) -> tuple[np.ndarray, int]:
    """float32 [len(docs)] scores of (queries[i], docs[i]), or of the one query with every document, and
    the tokens sent (for usage). max_tokens: what a pair is cut to with truncate (pair_truncation's). raw: the
    logits before the model's activation (the score itself where the model has none)."""
    check_instruction(gw, instruction)
    cut = gw.config.truncate if truncate is None else truncate
    pairs = await gw.encoder.encode_pairs(queries, docs, truncate=cut, side=side, instruction=instruction,
                                          names=names, max_tokens=max_tokens)
    rows = await unless_disconnected(request, gw.embed(pairs.sequences, token_types=pairs.token_types,
                                                       deadline=deadline, lane=lane,
                                                       output=logit_output(gw) if raw else ""))
    return rows[:, 0], sum(map(len, pairs.sequences))


def logit_output(gw: Gateway) -> str:
    """The Tulip output of a reranker's logit: `logit` where an activation lies between it and the score, else the
    default (the score is the logit; rose.cross_spec ScoreHead.outputs)."""
    return LOGIT if find_output(gw.spec.outputs, LOGIT) is not None else ""

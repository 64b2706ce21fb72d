"""POST /predict (text-embeddings-inference's) and POST /classify (vLLM's): a sequence classifier's labels.

The served model's native row is its logits, one per label (rose.cross_spec, task "classify"); the scores are
made here per request (rose.head.label_scores): softmax over the labels, each label's sigmoid for a multi-label
model (problem_type multi_label_classification), or the logits (TEI's raw_scores, vLLM's use_activation false).
Labels are config.json's id2label in index order, read from the folder Ivy tokenizes for (ModelSpec), which
the replicas serve (their tasks and width checked at Info). /predict's pair [text, text_pair] is the tokenizer's
pair encoding, BERT's token types along, cut longest first (ivy.pairs, as rerank's pairs); its texts and vLLM's
inputs are tokenized as /v1/embeddings' (ivy.routes_embeddings' encode_inputs for /classify, ids included).
Limits and errors are every route's: the inputs' count, a text over the model's length a 422 naming it unless
`truncate`, a model without the task a 400 unsupported_task. A reranker is served at /predict as text-embeddings-
inference serves it, a classifier of one label (LABEL_0, its logit's sigmoid); a yes/no reranker is not (its prompt
is /rerank's). Metrics count the inputs and the tokens sent.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ivy import request_trace
from ivy.gateway import Gateway
from ivy.inputs import PredictInputs
from ivy.pooling import input_truncation
from ivy.routes_embeddings import encode_inputs
from ivy.responses import ClassifyResponse, Prediction
from ivy.schemas import ClassifyRequest, PredictRequest
from ivy.web import gateway_of, json_response, request_body, unless_disconnected, usage
from ivy.cross_encode import logit_output
from ivy.errors import IvyError, Problem
from rose.head import label_scores

RERANKER_LABEL = "LABEL_0"  # a reranker's one label, as transformers names it (TEI's /info and /predict)

router = APIRouter()


@router.post("/predict", openapi_extra=request_body(PredictRequest),
             responses={200: {"model": list[Prediction] | list[list[Prediction]]}})
async def tei_predict(request: Request) -> Response:
    """Every label's score per input, best first: one input's list, or (a batch) one list per input. A reranker
    is TEI's classifier of one label: its logit's sigmoid (the raw logit with raw_scores) as LABEL_0, whatever
    activation its /rerank scores take (TEI applies the sigmoid to one label, softmax to several)."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, PredictRequest, None if gw.cross_encoder else "classify",
                                                 "/predict")
    inputs = body.inputs
    head = gw.spec.score_head
    if gw.cross_encoder and head.kind == "yes_no":
        raise IvyError(Problem.UNSUPPORTED_TASK, f"/predict scores a classifier's labels; {gw.model_name!r} is a "
                       "yes/no reranker, whose prompt /rerank and /v1/score build: send the pairs there", param="model")
    with gw.admit():
        gw.check_count(len(inputs.items), gw.config.max_inputs_per_request, "inputs")
        cut = gw.config.truncate if body.truncate is None else body.truncate
        seqs, types = await _encode_predict(gw, inputs, cut, body.truncation_side)
        logits = await unless_disconnected(request, gw.embed(seqs, token_types=types, deadline=deadline, lane=lane,
                                                             output=logit_output(gw)))
        one_label = not head.labels  # a reranker
        scores = label_scores(logits, multi_label=head.multi_label or one_label, raw=body.raw_scores)
        labels = head.labels or (RERANKER_LABEL,)
        answers = [[{"score": float(row[j]), "label": labels[j]} for j in np.argsort(row, kind="stable")[::-1]]
                   for row in scores]
        request_trace.count_usage("/predict", len(seqs), sum(map(len, seqs)))  # counted once answered 2xx
        return json_response(answers if inputs.shape == "batch" else answers[0])


async def _encode_predict(gw: Gateway, inputs: PredictInputs, truncate: bool, side: str):
    """(sequences, token types or None) in the inputs' order: texts as /v1/embeddings tokenizes them, pairs as
    the tokenizer's pair encoding (ivy.pairs); each error names the text as sent (inputs[2][1])."""
    singles = [k for k, item in enumerate(inputs.items) if len(item) == 1]
    pairs = [k for k, item in enumerate(inputs.items) if len(item) == 2]
    seqs: list = [None] * len(inputs.items)
    types: list = [None] * len(inputs.items)
    if singles:
        encoded = await gw.encoder.encode_texts([inputs.items[k][0] for k in singles], truncate=truncate, side=side,
                                                param=tuple(inputs.name(k, 0) for k in singles))
        for k, ids in zip(singles, encoded):
            seqs[k], types[k] = ids, [0] * len(ids)
    if pairs:
        names = tuple(tuple(inputs.name(k, j) for k in pairs) for j in (0, 1))
        encoded = await gw.encoder.encode_pairs([inputs.items[k][0] for k in pairs],
                                                [inputs.items[k][1] for k in pairs], truncate=truncate, side=side,
                                                instruction=None, names=names)
        for i, k in enumerate(pairs):
            seqs[k] = encoded.sequences[i]
            types[k] = encoded.token_types[i] if encoded.token_types is not None else [0] * len(seqs[k])
    return seqs, types if gw.spec.type_vocab_size > 1 and pairs else None


@router.post("/classify", openapi_extra=request_body(ClassifyRequest), responses={200: {"model": ClassifyResponse}})
async def vllm_classify(request: Request) -> Response:
    """vLLM's shape: per input its best label and every label's probability in label order (`probs`)."""
    gw = gateway_of(request)
    body, deadline, lane = await gw.open_request(request, ClassifyRequest, "classify", "/classify")
    truncate, max_tokens = input_truncation(gw, body)
    with gw.admit():
        gw.check_count(len(body.input), gw.config.max_inputs_per_request, "input")
        seqs = await encode_inputs(gw, body.input, route="/classify", param="input", truncate=truncate,
                                   side=body.truncation_side, prompt=(None, None), max_tokens=max_tokens)
        logits = await unless_disconnected(request, gw.embed(seqs, deadline=deadline, lane=lane))
        head = gw.spec.score_head
        probs = label_scores(logits, multi_label=head.multi_label, raw=not body.activated)
        data = [{"index": i, "label": head.labels[int(np.argmax(row))], "probs": row.tolist(),
                 "num_classes": len(head.labels)} for i, row in enumerate(probs)]
        tokens = sum(map(len, seqs))
        return json_response({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                              "model": gw.model_name, "data": data,
                              "usage": {**usage(tokens), "completion_tokens": 0, "prompt_tokens_details": None}})

"""Other embedding APIs' fields on /v1/embeddings (and /embeddings), read as Ivy's or refused by name, never
silently ignored: a client that sends them expects vectors or bytes that depend on them.

- Task selectors pick the query or document prompt, as `input_type` does: Jina's `task` (retrieval.query,
  retrieval.passage), Nomic's `task_type` (search_query, search_document), Gemini's `task_type` / `taskType`
  (RETRIEVAL_QUERY, RETRIEVAL_DOCUMENT). Their other tasks (classification, clustering, text-matching, ...) select a
  provider's own adapter or prompt: refused.
- Jina's `embedding_type` and Voyage's `output_dtype`: float served, Jina's base64 read as `encoding_format` base64;
  the providers' quantized types (their own quantization) refused.
- Refused when they ask for what this route does not do: Jina's `return_multivector` (served at /embed_multi_vector),
  Infinity's `modality` other than text, Nomic's `long_text_mode: mean` (`truncate` is read as Ivy's truncate),
  Mixedbread's free-text `prompt`. (Jina's `late_chunking` is a field of /v1/embeddings: ivy.routes_embeddings.)
Other servers' names for Ivy's own fields, on every body (read_peer_names): text-embeddings-inference's
truncation_direction ("Left" | "Right"), Voyage's top_k (rerank) and truncation (bool), Jina's normalized, Nomic's
`dimensionality` and Gemini's `output_dimensionality`, vLLM's older softmax / activation, ... (_SAME_MEANING); listed
in PEER_ALIASES, which the misspelling check (ivy.body) skips.
"""

from __future__ import annotations

from ivy.inputs import SCORE_SIDES, _wrong
from ivy.vllm_fields import refuse

_QUANTIZED = ("the provider's own quantized types are not served; for smaller vectors send encoding_format "
              "base64_int8 or base64_binary (Ivy's), or use /v2/embed's binary and ubinary (Cohere's)")
_QUERY, _DOCUMENT = "query", "document"
_TASKS = {  # field -> {its value: input_type}
    "task": {"retrieval.query": _QUERY, "retrieval.passage": _DOCUMENT},
    "task_type": {"search_query": _QUERY, "search_document": _DOCUMENT, "RETRIEVAL_QUERY": _QUERY,
                  "RETRIEVAL_DOCUMENT": _DOCUMENT},
    "taskType": {"RETRIEVAL_QUERY": _QUERY, "RETRIEVAL_DOCUMENT": _DOCUMENT},
}
FIELDS = frozenset({*_TASKS, "embedding_type", "output_dtype", "return_multivector", "modality", "long_text_mode",
                    "prompt"})
# Voyage / Cohere v2 / Jina, sentence-transformers' truncate_dim, vLLM's use_activation (an embedding's normalization)
_SAME_MEANING = {"top_k": "top_n", "truncation": "truncate", "normalized": "normalize",
                 "output_dimension": "dimensions", "truncate_dim": "dimensions", "use_activation": "normalize",
                 "dimensions": "output_dimension",  # Cohere's /v2/embed, whose own name is output_dimension
                 "dimensionality": "dimensions", "output_dimensionality": "dimensions",  # Nomic's, Gemini's
                 "outputDimensionality": "dimensions",
                 "softmax": "use_activation", "activation": "use_activation"}  # vLLM's older names (softmax first)
PEER_ALIASES = frozenset({"truncation_direction", *_SAME_MEANING, *(n for pair in SCORE_SIDES for n in pair),
                          *FIELDS})  # FIELDS: read_peer_fields reads them (embedding_type is no embed_dtype)


def read_peer_fields(data: dict) -> dict:
    """The body with the peers' fields read as Ivy's, or an IvyError naming the first that asks for what is not
    served; one set test when the body has none of them (nearly every body)."""
    if FIELDS.isdisjoint(data):
        return data
    data = dict(data)
    for field, values in _TASKS.items():
        task = data.get(field)
        if task is None:
            continue
        if task not in values:
            raise refuse(field, f"must be {' or '.join(values)} (the model's query or document prompt, as "
                                "input_type); the provider's other tasks select its own adapters or prompts")
        data.setdefault("input_type", values[task])
    kind = data.get("embedding_type")
    if kind == "base64":
        data.setdefault("encoding_format", "base64")
    elif kind not in (None, "float"):
        raise refuse("embedding_type", f'must be "float" or "base64": {_QUANTIZED}')
    if data.get("output_dtype") not in (None, "float"):
        raise refuse("output_dtype", f'must be "float": {_QUANTIZED}')
    if data.get("return_multivector") is True:
        raise refuse("return_multivector", "token vectors are served at /embed_multi_vector (a multi-vector model)")
    if data.get("modality") not in (None, "text"):
        raise refuse("modality", 'must be "text": this model reads text')
    mode = data.get("long_text_mode")
    if mode == "truncate":
        data.setdefault("truncate", True)
    elif mode is not None:
        raise refuse("long_text_mode", 'must be "truncate": a long text is cut, not split and averaged')
    if data.get("prompt") is not None:
        raise refuse("prompt", "a free-text prompt is not served; send input_type (query or document) or "
                               "prompt_name (one of the model's prompts)")
    return data


def read_peer_names(data: dict, fields, prefix: str = "") -> dict:
    """`data` with other servers' names for the model's `fields` read as those fields (ours wins when both are
    sent); a `truncation_side` null (a proxy's dump) is the default. `prefix`: where the body sits, for errors."""
    if "truncation_side" in data and data["truncation_side"] is None:
        data = {k: v for k, v in data.items() if k != "truncation_side"}
    if "truncation_direction" in data and "truncation_side" not in data and "truncation_side" in fields:
        side = data["truncation_direction"]
        if not (isinstance(side, str) and side.lower() in ("left", "right")):  # named as sent, not as ours
            raise _wrong(prefix + "truncation_direction", '"Left" or "Right"')
        data = {**data, "truncation_side": side.lower()}
    for theirs, ours in _SAME_MEANING.items():
        if theirs in data and ours not in data and ours in fields:
            data = {**data, ours: data[theirs]}
    return data

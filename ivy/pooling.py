"""vLLM's pooling API (POST /pooling) on Ivy: which of its request fields are served, and how.

vLLM's PoolingCompletionRequest (vllm/entrypoints/pooling/pooling/protocol.py and base/protocol.py; the API at
https://docs.vllm.ai/en/latest/models/pooling_models/pooling/) takes /v1/embeddings' `input` and options plus its
own. Ivy serves its embed task, the vectors /v1/embeddings gives, in vLLM's response shape (PoolingResponse;
the models are here rather than in ivy.schemas, which they extend). What it has that Ivy cannot honour is
refused by name, never silently ignored: chat `messages` (no chat template is applied), an IO processor
plugin's `data`, `mm_processor_kwargs`, a `task` other than "embed", `add_special_tokens: false`, `padding:
"max_length"` (every `embed_dtype` is served, in either byte order, and the raw `bytes` answers).
Messages name the field and what is served, never the value sent (ivy.errors). A body with vLLM's defaults
written out (nulls, priority 0, a request_id) is served as if they were omitted: priority 0 picks the lane by
size, as no priority does (a non-zero one picks it as on every route, ivy/lanes.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from ivy.errors import IvyError, Problem
from ivy.inputs import Dimensions, EmbeddingInput, RawEncodingFormat, Side
from ivy.lanes import PRIORITY_RULE
from ivy.responses import Usage
from ivy.schemas import EMBED_DTYPE, ENDIANNESS, EmbedDtype, Endianness, Priority, _Request
from ivy.vllm_fields import refuse, refuse_unserved

_SCORES = "a reranker's scores are served at /v1/score and /v1/rerank"
_ELSEWHERE = {  # vLLM's other pooling tasks (vllm/tasks.py, removed ones included): where Ivy serves the like
    "classify": "a classifier's labels are served at /classify (vLLM's shape) and /predict (TEI's)",
    "score": _SCORES,
    "token_embed": "a multi-vector model's token vectors are served at /embed_multi_vector",
    "token_classify": "token classification (and reward models) is not served",
    "embed&token_classify": "token classification is not served; /v1/embeddings gives the embeddings",
    "encode": "vLLM removed it; /pooling here embeds (task embed)",
    "plugin": "IO processor plugins are not served",
}


def check_fields(data: Any) -> Any:
    """The raw body refused where it asks for what Ivy cannot honour (a pydantic before-validator: the field
    types are checked after it)."""
    if not isinstance(data, dict):
        return data
    if "data" in data and "input" not in data:
        raise refuse("data", "IO processor plugin requests are not served; send input (texts or token ids)")
    refuse_unserved(data, encoding_format=True)
    task = data.get("task")
    if task is not None and task != "embed":
        where = _ELSEWHERE.get(task) if isinstance(task, str) else None
        raise refuse("task", f'/pooling serves the task "embed" only (one pooled vector per input)'
                              f'{"; " + where if where else ""}', Problem.UNSUPPORTED_TASK)
    priority = data.get("priority")
    if type(priority) in (int, float) and priority == 0:  # vLLM's default, written out: as omitted (by size)
        data = {**data, "priority": None}
    return data


def prompt_truncation(value: int | None, truncate: bool | None, max_length: int, specials: int,
                      texts: bool) -> tuple[bool | None, int | None]:
    """vLLM's truncate_prompt_tokens (and Ivy's `truncate`) as (truncate, max_tokens) for ivy.routes_embeddings:
    None = `truncate` (omitted: the server's default, as /v1/embeddings), -1 = cut to the model's length, k = keep
    k tokens, the special tokens of a text included (the side: truncation_side; vLLM's pooling runner keeps the
    first k, as Ivy's default "right" does). A text's k leaves room for its special tokens and one more."""
    if value is None:
        return truncate, None
    if truncate is False:
        raise IvyError(Problem.INVALID_PARAMETER, "truncate: false contradicts truncate_prompt_tokens; send one "
                       "of them", param="truncate")
    if value == -1:
        return True, None
    least = specials + 1 if texts else 1
    if not least <= value <= max_length:
        what = f"a text's {specials} special tokens and one more" if texts and specials else "one token"
        raise IvyError(Problem.INVALID_PARAMETER, f"truncate_prompt_tokens must be -1 (the model's length, "
                       f"{max_length}) or between {least} ({what}) and {max_length}, got {value}",
                       param="truncate_prompt_tokens", limit=max_length)
    return True, value


def input_truncation(gw, body) -> tuple[bool | None, int | None]:
    """prompt_truncation of a body with `input`, `truncate` and `truncate_prompt_tokens` (/v1/embeddings, /pooling,
    /classify): the served model's length and special tokens, texts or token ids as the input holds."""
    return prompt_truncation(body.truncate_prompt_tokens, body.truncate, gw.spec.max_length,
                             gw.tokenizer.num_special, texts=body.input.texts is not None)


class PoolingRequest(_Request):
    """vLLM's POST /pooling (its PoolingCompletionRequest) for an embedding model: /v1/embeddings' vectors in
    vLLM's shape. Its fields Ivy cannot honour are refused by name (check_fields); `use_activation` (vLLM's newer
    name for an embedding's normalization) is read as `normalize`, as on every route (ivy.schemas' peer names)."""

    input: EmbeddingInput
    task: Literal["embed"] | None = Field(default=None, description='"embed" or omitted; other tasks are refused.')
    encoding_format: RawEncodingFormat | None = Field(default=None, description="float (default), base64 "
                                                   "(float32, or embed_dtype's), base64_int8, base64_binary, bytes, "
                                                   "bytes_only (as on /v1/embeddings).")
    embed_dtype: EmbedDtype | None = Field(default=None, description=EMBED_DTYPE)
    endianness: Endianness | None = Field(default=None, description=ENDIANNESS)
    dimensions: Dimensions | None = None
    normalize: bool | None = Field(default=None, description="L2-normalize; omitted = the model's own default.")
    truncate_prompt_tokens: int | None = Field(default=None, description="-1: cut to the model's length; k: keep k "
                                               "tokens (special tokens included); omitted: `truncate`.")
    truncate: bool | None = Field(default=None, description="Ivy's: cut over-long inputs to the model's length "
                                  "(truncate_prompt_tokens -1); omitted = the server default.")
    truncation_side: Side | None = Field(default=None, description="right (omitted) keeps the first tokens.")
    add_special_tokens: Literal[True] = True
    padding: Literal["do_not_pad"] | None = None
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}; 0, vLLM's default, is "
                               "read as omitted.")
    user: str | None = None
    request_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@/+=-]{1,128}$",
                                   description='The response\'s id is "pool-" and it (X-Request-Id wins).')
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024,
                                   description="Accepted; Ivy keeps no prefix cache to salt.")

    @model_validator(mode="before")
    @classmethod
    def _vllm_fields(cls, data: Any) -> Any:
        return check_fields(data)


class PoolingUsage(Usage):
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | str


class PoolingResponse(BaseModel):
    """vLLM's PoolingResponse: `id` is "pool-" and the request's id."""

    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: PoolingUsage
